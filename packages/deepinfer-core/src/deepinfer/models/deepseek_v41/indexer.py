"""Lightning indexer (model spec §4.4, §6.5): index keys, per-query scores, candidate blocks, top-k."""

from __future__ import annotations

import torch

from deepinfer.cache import Codec
from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.linear import make_linear
from deepinfer.models.deepseek_v41.step_state import Rows, Selection, StepState
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops


def candidate_blocks(
    scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block: int
) -> torch.Tensor:
    """Entry mask of the `topk_blocks` best blocks (max-pooled scores), the latest visible block forced in.

    scores [n, N] with -inf at invisible entries; visible [n] = visible entry count per row.
    """
    width = scores.shape[-1]
    pooled = torch.nn.functional.pad(scores, (0, -width % block), value=-torch.inf)
    pooled = pooled.unflatten(-1, (-1, block)).amax(-1)
    latest = ((visible - 1) // block).unsqueeze(-1)  # -1 when nothing is visible: forces no block
    pooled = pooled.masked_fill(torch.arange(pooled.shape[-1], device=scores.device) == latest, torch.inf)
    best = pooled.topk(min(topk_blocks, pooled.shape[-1]), dim=-1)
    keep = torch.zeros_like(pooled, dtype=torch.bool).scatter(-1, best.indices, best.values > -torch.inf)
    return keep.repeat_interleave(block, dim=-1)[:, :width] & torch.isfinite(scores)


class Indexer:
    """Index keys (index-K sources) and/or the per-token selection (index sources) of one layer."""

    def __init__(self, cfg: TextConfig, spec: LayerSpec, weights: Weights, ops: Ops, dtype: torch.dtype):
        self.spec, self.ops, self.dtype, self.eps = spec, ops, dtype, cfg.rms_norm_eps
        self.heads, self.dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.topk_blocks, self.block = cfg.candidate_topk_blocks, cfg.candidate_block_size
        if spec.owns_index_keys:
            self.wk = make_linear(weights, "wk", ops, dtype, (self.dim, cfg.head_dim))
            self.k_norm = weights.get("k_norm.weight", (self.dim,))
        if spec.owns_indexer_query:
            self.wq_b = make_linear(weights, "wq_b", ops, dtype, (self.heads * self.dim, cfg.q_lora_rank))
            shape = (self.heads, cfg.hidden_size)
            self.weights_proj = make_linear(weights, "weights_proj", ops, dtype, shape)
            self.weight_scale = (self.dim * self.heads) ** -0.5

    def keys(self, latent: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Pre-RoPE compressed latents [m, head_dim] -> index keys [m, index_head_dim], not yet quantised."""
        k = self.ops.rms_norm(self.wk(latent), self.k_norm, self.eps)
        return self.ops.rope_interleaved(k, angles)

    def select(
        self, q_latent: torch.Tensor, x: torch.Tensor, angles: torch.Tensor, rows: Rows, step: StepState
    ) -> None:
        """Score every visible entry for each row, publish top-k (and candidate blocks) on `step`."""
        spec, ratio = self.spec, self.spec.compress_ratio
        q = self.ops.rope_interleaved(self.wq_b(q_latent).unflatten(-1, (self.heads, self.dim)), angles)
        if step.cache.precision == "release":  # indexer queries cross the same MXFP4 boundary as the keys
            _, q = Codec("mxfp4", self.dim, self.dtype).round_trip(q.flatten(0, 1), self.ops)
            q = q.unflatten(0, (-1, self.heads))
        w = self.weights_proj(x) * self.weight_scale
        keys = step.stream(spec).index_keys
        topk, cands = [], []
        for i, (b, e) in enumerate(rows.bounds):
            visible = (rows.positions[b:e] + 1) // ratio
            scores = self.ops.indexer_logits(q[b:e], keys[i], w[b:e])
            width = scores.shape[-1]
            future = torch.arange(width, device=x.device) >= visible.unsqueeze(-1)
            scores = scores.masked_fill(future, -torch.inf)
            if spec.is_candidate_source:
                cands.append(candidate_blocks(scores, visible, self.topk_blocks, self.block))
            elif spec.restricted_to_candidates:
                if step.candidates is None:
                    raise RuntimeError(f"layer {spec.index} needs candidates, but no candidate source ran")
                scores = scores.masked_fill(~step.candidates.per_segment[i], -torch.inf)
            best = scores.topk(min(self.topk, width), dim=-1, sorted=False).indices.sort(dim=-1).values
            topk.append(torch.where(torch.isfinite(scores.gather(-1, best)), best, -1))
        step.topk = Selection(spec.index, topk)
        if spec.is_candidate_source:
            step.candidates = Selection(spec.index, cands)
