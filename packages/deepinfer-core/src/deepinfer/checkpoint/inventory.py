"""The exact tensor list of a release checkpoint for a given config (model spec §13.2, §14).

Names are the release names without a `model.` prefix. Vision weights (`vision.*`, `aligner.*`,
`image_*`) are not part of the inventory yet: the loader ignores them and the writer does not emit
them (tiny configs use a zero-depth vision tower, as the nemo oracle does for text-only models).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from deepinfer.checkpoint.formats import FP4_GROUP, FP8_BLOCK, scale_shape
from deepinfer.config import LayerSpec, ModelConfig, TextConfig

# how the bytes are encoded: release codecs, their scales, or plain floats
Kind = Literal["fp8", "fp4", "fp8_rows", "scale", "dense"]

# safetensors dtype name -> bytes per element / torch storage dtype
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1}
TORCH_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I8": torch.int8,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype the writer emits (the nemo export's choice)
    kind: Kind
    group: str  # reporting class, e.g. "attention", "routed_experts", "engram_table"
    accepted: tuple[str, ...] = ()  # other on-disk dtypes the loader also accepts (spec §13.6)

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n

    @property
    def dtypes(self) -> tuple[str, ...]:
        return (self.dtype, *self.accepted)


def _dense(name: str, shape: tuple[int, ...], dtype: str, group: str, accepted: tuple[str, ...] = ()):
    return [TensorSpec(name, shape, dtype, "dense", group, accepted)]


def _fp8(prefix: str, rows: int, cols: int, group: str) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}.weight", (rows, cols), "F8_E4M3", "fp8", group),
        TensorSpec(f"{prefix}.scale", scale_shape((rows, cols), FP8_BLOCK), "F8_E8M0", "scale", group),
    ]


def _fp4(prefix: str, rows: int, cols: int, group: str) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}.weight", (rows, cols // 2), "I8", "fp4", group),
        TensorSpec(f"{prefix}.scale", (rows, -(-cols // FP4_GROUP)), "F8_E8M0", "scale", group),
    ]


def _fp8_rows(prefix: str, rows: int, cols: int, group: str) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}.weight", (rows, cols), "F8_E4M3", "fp8_rows", group),
        TensorSpec(f"{prefix}.scale", (rows, -(-cols // FP4_GROUP)), "F8_E8M0", "scale", group),
    ]


F32_OR_BF16 = ("BF16",)  # accepted alternative for the F32-in-nemo / BF16-in-DI classes


def _block(c: TextConfig, spec: LayerSpec, engram_rows: dict[int, int]) -> Iterator[TensorSpec]:
    """Tensors of one backbone layer or DSpark block."""
    H, p = c.hidden_size, spec.prefix
    n_h, d, G = c.num_attention_heads, c.head_dim, c.o_groups
    m = c.hc_mult
    yield from _fp8(f"{p}.attn.wq_a", c.q_lora_rank, H, "attention")
    yield from _dense(f"{p}.attn.q_norm.weight", (c.q_lora_rank,), "BF16", "norm")
    yield from _fp8(f"{p}.attn.wq_b", n_h * d, c.q_lora_rank, "attention")
    yield from _fp8(f"{p}.attn.wkv", d, H, "attention")
    yield from _dense(f"{p}.attn.kv_norm.weight", (d,), "BF16", "norm")
    yield from _fp8(f"{p}.attn.wo_a", G * c.o_lora_rank, (n_h // G) * d, "attention")
    yield from _fp8(f"{p}.attn.wo_b", H, G * c.o_lora_rank, "attention")
    yield from _dense(f"{p}.attn.attn_sink", (n_h,), "F32", "attention")
    if spec.owns_compressor:
        yield from _dense(f"{p}.attn.compressor.wkv.weight", (d, H), "F32", "compressor", F32_OR_BF16)
        if spec.compress_ratio > 1:
            yield from _dense(f"{p}.attn.compressor.wgate.weight", (d, H), "F32", "compressor", F32_OR_BF16)
        yield from _dense(f"{p}.attn.compressor.norm.weight", (d,), "BF16", "norm")
    if spec.owns_indexer_query:
        n_idx = c.index_n_heads * c.index_head_dim
        yield from _fp8(f"{p}.attn.indexer.wq_b", n_idx, c.q_lora_rank, "indexer")
        yield from _dense(f"{p}.attn.indexer.weights_proj.weight", (c.index_n_heads, H), "BF16", "indexer")
    if spec.owns_index_keys:
        yield from _dense(f"{p}.attn.indexer.wk.weight", (c.index_head_dim, d), "BF16", "indexer")
        yield from _dense(f"{p}.attn.indexer.k_norm.weight", (c.index_head_dim,), "BF16", "norm")

    dspark = spec.dspark_block is not None
    E = c.dspark_n_routed_experts if dspark else c.n_routed_experts
    inter = c.moe_intermediate_size
    yield from _dense(f"{p}.ffn.gate.weight", (E, H), "BF16", "router")
    yield from _dense(f"{p}.ffn.gate.bias", (E,), "F32", "router")
    yield from _dense(f"{p}.ffn.gate.bias_vl", (E,), "F32", "router")
    for e in range(E):
        yield from _fp4(f"{p}.ffn.experts.{e}.w1", inter, H, "routed_experts")
        yield from _fp4(f"{p}.ffn.experts.{e}.w3", inter, H, "routed_experts")
        yield from _fp4(f"{p}.ffn.experts.{e}.w2", H, inter, "routed_experts")
    yield from _fp8(f"{p}.ffn.shared_experts.w3", inter, H, "shared_experts")
    yield from _fp8(f"{p}.ffn.shared_experts.w1", inter, H, "shared_experts")
    yield from _fp8(f"{p}.ffn.shared_experts.w2", H, inter, "shared_experts")
    yield from _dense(f"{p}.attn_norm.weight", (H,), "BF16", "norm")
    yield from _dense(f"{p}.ffn_norm.weight", (H,), "BF16", "norm")
    n_mix = 2 * m + m * m
    for sub in ("attn", "ffn"):
        yield from _dense(f"{p}.hc_{sub}_fn", (n_mix, m * H), "F32", "mhc")
        yield from _dense(f"{p}.hc_{sub}_base", (n_mix,), "F32", "mhc")
        yield from _dense(f"{p}.hc_{sub}_scale", (3,), "F32", "mhc")

    if spec.is_engram:
        D = c.engram_head_dim
        n_rows = (c.engram_max_ngram_size - 1) * c.engram_n_heads
        yield from _fp8_rows(f"{p}.engram.embed", engram_rows[spec.index], D, "engram_table")
        yield from _fp8(f"{p}.engram.wkv", (m + 1) * H, n_rows * D, "engram")
        yield from _dense(f"{p}.engram.q_weight", (m, H), "BF16", "engram")
        yield from _dense(f"{p}.engram.k_weight", (m, H), "BF16", "engram")

    if dspark and spec.dspark_block == 0:
        yield from _fp8(f"{p}.main_proj", H, len(c.dspark_target_layer_ids) * H, "dspark")
        yield from _dense(f"{p}.main_norm.weight", (H,), "BF16", "norm")
    if dspark and spec.dspark_block == c.num_nextn_predict_layers - 1:
        r = c.dspark_markov_rank
        yield from _dense(f"{p}.norm.weight", (H,), "BF16", "norm")
        yield from _dense(f"{p}.markov_head.embed.weight", (c.vocab_size, r), "BF16", "dspark")
        yield from _dense(f"{p}.markov_head.head.weight", (c.vocab_size, r), "BF16", "dspark")
        yield from _dense(f"{p}.confidence_head.proj.weight", (1, H + r), "F32", "dspark", F32_OR_BF16)


def iter_inventory(config: ModelConfig | TextConfig) -> Iterator[TensorSpec]:
    """Every tensor of the release checkpoint, in a stable order (globals, layers, DSpark blocks)."""
    c = config.text if isinstance(config, ModelConfig) else config
    V, H, m = c.vocab_size, c.hidden_size, c.hc_mult
    yield from _dense("embed.weight", (V, H), "BF16", "embed_head")
    yield from _dense("norm.weight", (H,), "BF16", "norm")
    yield from _dense("head.weight", (V, H), "F32", "embed_head", F32_OR_BF16)
    if not c.hc_shifted:
        # the non-shifted mHC variant ends with an HC head (spec §7); the release does not use it
        yield from _dense("hc_head_fn", (m, m * H), "F32", "mhc")
        yield from _dense("hc_head_base", (m,), "F32", "mhc")
        yield from _dense("hc_head_scale", (1,), "F32", "mhc")
    engram_rows = dict(zip(c.engram_layer_ids, c.engram_rows))
    for spec in c.layers:
        yield from _block(c, spec, engram_rows)


def inventory(config: ModelConfig | TextConfig) -> dict[str, TensorSpec]:
    """name -> TensorSpec for every tensor the checkpoint must contain."""
    return {t.name: t for t in iter_inventory(config)}
