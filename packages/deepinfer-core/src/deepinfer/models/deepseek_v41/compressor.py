"""KV compressor of a KV-source layer (model spec §6.4): ratio 2 softmax-gated pooling, ratio 1 projection.

Works incrementally: a segment's tokens are appended to the partial group left in the slot's
compressor ring, and only complete groups produce entries, so chunked prefill and decode give the
same entries as one full pass. The ring keeps (gate, value) of the last ratio - 1 + max_backtrack
tokens in float32, which also makes rollback free.
"""

from __future__ import annotations

import torch

from deepinfer.cache import Ring
from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.linear import make_linear
from deepinfer.models.deepseek_v41.step_state import Segment
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops


class Compressor:
    def __init__(self, cfg: TextConfig, spec: LayerSpec, weights: Weights, ops: Ops, dtype: torch.dtype):
        self.ratio, self.ops, self.dtype, self.eps = spec.compress_ratio, ops, dtype, cfg.rms_norm_eps
        shape = (cfg.head_dim, cfg.hidden_size)
        # pooling runs in float32 (the release stores these weights unquantised); ratio 1 in the model dtype
        proj_dtype = torch.float32 if self.ratio > 1 else dtype
        self.wkv = make_linear(weights, "wkv", ops, proj_dtype, shape)
        self.wgate = make_linear(weights, "wgate", ops, torch.float32, shape) if self.ratio > 1 else None
        self.norm = weights.get("norm.weight", (cfg.head_dim,))

    def __call__(self, x: torch.Tensor, seg: Segment, state: Ring | None) -> tuple[int, torch.Tensor]:
        """x [n, H]: inputs at positions [seg.start, seg.end) -> (first new entry, latents [m, head_dim]).

        The latents are the normed, pre-RoPE compressed vectors of the groups completed by this segment.
        """
        r = self.ratio
        if r == 1:
            return seg.start, self.ops.rms_norm(self.wkv(x), self.norm, self.eps)
        gate_value = torch.cat((self.wgate(x), self.wkv(x)), dim=-1)  # [n, 2D] float32
        group_start = seg.start // r * r
        carried = state.load(seg.slot, torch.arange(group_start, seg.start, device=x.device))
        pending = torch.cat((carried, gate_value))
        state_pos = torch.arange(max(seg.start, seg.end - state.length), seg.end, device=x.device)
        state.write(seg.slot, state_pos, state.codec.encode(gate_value[state_pos - seg.start], self.ops))
        groups = pending.shape[0] // r
        gate, value = pending[: groups * r].unflatten(0, (groups, r)).chunk(2, dim=-1)
        pooled = (value * gate.softmax(dim=1)).sum(dim=1).to(self.dtype)
        return group_start // r, self.ops.rms_norm(pooled, self.norm, self.eps)
