"""Lightning indexer (model spec §4.4, §6.5): index keys, per-query scores, candidate blocks, top-k."""

from __future__ import annotations

import math

import torch

from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.linear import make_linear
from deepinfer.models.deepseek_v41.metadata import RowSet
from deepinfer.models.deepseek_v41.step_state import Selection, StepState
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops


class Indexer:
    """Index keys (index-K sources) and/or the per-token selection (index sources) of one layer.

    The query projection `indexer.wq_b` reads the attention's query latent: the attention stacks it with
    its own `wq_b` (one launch) and hands the projected queries to `select`."""

    def __init__(self, cfg: TextConfig, spec: LayerSpec, weights: Weights, ops: Ops, dtype: torch.dtype):
        self.spec, self.ops, self.dtype, self.eps = spec, ops, dtype, cfg.rms_norm_eps
        self.heads, self.dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.topk_blocks, self.block = cfg.candidate_topk_blocks, cfg.candidate_block_size
        if spec.owns_index_keys:
            self.wk = make_linear(weights, "wk", ops, dtype, (self.dim, cfg.head_dim))
            self.k_norm = weights.get("k_norm.weight", (self.dim,))
        if spec.owns_indexer_query:
            shape = (self.heads, cfg.hidden_size)
            self.weight_scale = (self.dim * self.heads) ** -0.5
            if math.log2(self.weight_scale).is_integer():
                # a power of two (1/64 at Flash widths) commutes with every rounding: folded into the
                # weight at load, the projection gives the scaled head weights bit for bit, one launch fewer
                name = weights.name("weights_proj.weight")
                weights = Weights({name: weights.get("weights_proj.weight", shape) * self.weight_scale},
                                  weights.prefix)
                self.weight_scale = 1.0
            self.weights_proj = make_linear(weights, "weights_proj", ops, dtype, shape)

    def keys(self, latent: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Pre-RoPE compressed latents [m, head_dim] -> index keys [m, index_head_dim], not yet quantised."""
        return self.ops.rms_norm_rope(self.wk(latent), self.k_norm, self.eps, angles)

    def select(
        self, q: torch.Tensor, x: torch.Tensor, angles: torch.Tensor, rows: RowSet, step: StepState
    ) -> None:
        """Score every visible entry for each row, publish top-k (and candidate blocks) on `step`.

        q: the projected queries [T, heads * dim] (indexer.wq_b of the query latent), before RoPE."""
        spec, ratio = self.spec, self.spec.compress_ratio
        q = self.ops.rope_interleaved(q.unflatten(-1, (self.heads, self.dim)), angles, inplace=True)
        if step.cache.precision == "release":
            # indexer queries cross the same MXFP4 boundary as the keys: Codec("mxfp4").round_trip's
            # values without its byte packing (two launches instead of five)
            q = self.ops.mxfp4_dequantize(*self.ops.mxfp4_quantize(q), self.dtype)
        w = self.weights_proj(x)
        if self.weight_scale != 1.0:
            w = w * self.weight_scale
        allowed = None
        if spec.restricted_to_candidates:
            if step.candidates is None:
                raise RuntimeError(f"layer {spec.index} needs candidates, but no candidate source ran")
            allowed = step.candidates.value
        keys = step.cache.index_keys(spec.kv_source)
        top, mask = self.ops.indexer_topk(
            q, w, keys.data, keys.codec, step.meta.block_tables, rows.row_seg, rows.visible[ratio],
            step.meta.compression[ratio].capacity, self.topk, allowed=allowed,
            candidates=(self.topk_blocks, self.block) if spec.is_candidate_source else None,
        )
        step.topk = Selection(spec.index, top)
        if mask is not None:
            step.candidates = Selection(spec.index, mask)
