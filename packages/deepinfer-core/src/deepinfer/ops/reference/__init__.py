"""Reference op implementations, one module per op family. REFERENCE_OPS is the op set."""

from collections.abc import Callable

from deepinfer.ops.reference import (
    attention,
    cache_quant,
    engram,
    indexer,
    linear,
    mhc,
    moe,
    norm,
    rotary,
    sampling,
)

REFERENCE_OPS: dict[str, Callable] = {
    "rms_norm": norm.rms_norm,
    "prepare_linear": linear.prepare_linear,
    "linear": linear.linear,
    "hc_coefficients": mhc.hc_coefficients,
    "hc_collapse": mhc.hc_collapse,
    "hc_expand": mhc.hc_expand,
    "prepare_experts": moe.prepare_experts,
    "moe": moe.moe,
    "engram_hash": engram.engram_hash,
    "engram_lookup": engram.engram_lookup,
    "engram_gate": engram.engram_gate,
    "rope_interleaved": rotary.rope_interleaved,
    "rms_norm_rope": rotary.rms_norm_rope,
    "sparse_attention_sink": attention.sparse_attention_sink,
    "indexer_logits": indexer.indexer_logits,
    "sparse_attention_paged": attention.sparse_attention_paged,
    "indexer_topk": indexer.indexer_topk,
    "compressor_update": attention.compressor_update,
    "cache_write": cache_quant.cache_write,
    "apply_penalties": sampling.apply_penalties,
    "sample_tokens": sampling.sample_tokens,
    "compute_logprobs": sampling.compute_logprobs,
    "apply_token_bitmask": sampling.apply_token_bitmask,
    "fp8_quantize": cache_quant.fp8_quantize,
    "fp8_dequantize": cache_quant.fp8_dequantize,
    "nvfp4_quantize": cache_quant.nvfp4_quantize,
    "nvfp4_dequantize": cache_quant.nvfp4_dequantize,
    "mxfp4_quantize": cache_quant.mxfp4_quantize,
    "mxfp4_dequantize": cache_quant.mxfp4_dequantize,
}
