"""The `cuda` backend: Triton kernels for the ops we have written; the rest fall back to reference."""

from collections.abc import Callable

import torch

from deepinfer.ops import Backend
from deepinfer.ops.registry import invariant_ops
from deepinfer.plugins import module_available


class CudaBackend(Backend):
    name = "cuda"
    package = "deepinfer-kernels-cuda"
    priority = 100
    # one program per row (or per group of a row) with launch configs chosen from the row length only;
    # kernels whose configs depend on the number of rows take `batch_invariant` instead
    row_wise = frozenset({
        "rms_norm", "hc_collapse", "hc_expand", "rope_interleaved", "rms_norm_rope", "hc_collapse_norm",
        "fp8_quantize", "fp8_dequantize", "nvfp4_quantize", "nvfp4_dequantize", "mxfp4_quantize",
        "mxfp4_dequantize", "prepare_linear", "prepare_experts", "cache_write", "compressor_update",
        "engram_hash", "engram_lookup", "engram_gate",
        "apply_penalties", "sample_tokens", "apply_token_bitmask",
    })

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available() and module_available("triton")

    def ops(self, *, batch_invariant: bool = False) -> dict[str, Callable]:
        # Imported here: the kernel modules import triton, which CPU-only machines may lack.
        from deepinfer_kernels_cuda import (
            attention,
            cache_quant,
            compressor,
            engram,
            indexer,
            linear,
            mhc,
            moe,
            norm,
            rope,
            sampling,
        )

        table = {
            "rms_norm": norm.rms_norm,
            "hc_coefficients": mhc.hc_coefficients,
            "hc_collapse": mhc.hc_collapse,
            "hc_expand": mhc.hc_expand,
            "hc_collapse_norm": mhc.hc_collapse_norm,
            "hc_residual": mhc.hc_residual,
            "rope_interleaved": rope.rope_interleaved,
            "rms_norm_rope": rope.rms_norm_rope,
            "indexer_logits": indexer.indexer_logits,
            "indexer_topk": indexer.indexer_topk,
            "sparse_attention_sink": attention.sparse_attention_sink,
            "sparse_attention_paged": attention.sparse_attention_paged,
            "fp8_quantize": cache_quant.fp8_quantize,
            "fp8_dequantize": cache_quant.fp8_dequantize,
            "nvfp4_quantize": cache_quant.nvfp4_quantize,
            "nvfp4_dequantize": cache_quant.nvfp4_dequantize,
            "mxfp4_quantize": cache_quant.mxfp4_quantize,
            "mxfp4_dequantize": cache_quant.mxfp4_dequantize,
            "cache_write": cache_quant.cache_write,
            "compressor_update": compressor.compressor_update,
            "engram_hash": engram.engram_hash,
            "engram_lookup": engram.engram_lookup,
            "engram_gate": engram.engram_gate,
            "prepare_linear": linear.prepare_linear,
            "linear": linear.linear,
            "prepare_experts": moe.prepare_experts,
            "moe": moe.moe,
            "apply_penalties": sampling.apply_penalties,
            "sample_tokens": sampling.sample_tokens,
            "apply_token_bitmask": sampling.apply_token_bitmask,
        }
        return invariant_ops(table, self.row_wise) if batch_invariant else table
