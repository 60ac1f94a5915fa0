"""KV compressor of a KV-source layer (model spec §6.4): ratio 2 softmax-gated pooling, ratio 1 projection.

Works incrementally (op `compressor_update`): a segment's tokens are appended to the partial group
left in the slot's compressor ring, and only complete groups produce entries, so chunked prefill and
decode give the same entries as one full pass. The ring keeps (gate, value) of the last
ratio - 1 + max_backtrack tokens in float32, which also makes rollback free.
"""

from __future__ import annotations

import torch

from deepinfer.cache import Ring
from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.linear import make_fused_linear, make_linear
from deepinfer.models.deepseek_v41.metadata import Compression
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops


class Compressor:
    def __init__(self, cfg: TextConfig, spec: LayerSpec, weights: Weights, ops: Ops, dtype: torch.dtype):
        self.ratio, self.ops, self.dtype, self.eps = spec.compress_ratio, ops, dtype, cfg.rms_norm_eps
        shape = (cfg.head_dim, cfg.hidden_size)
        # pooling runs in float32 (the release stores these weights unquantised), on gate and value
        # projected together (one stacked weight); ratio 1 projects in the model dtype
        if self.ratio > 1:
            self.gate_kv = make_fused_linear(weights, [("wgate", shape), ("wkv", shape)], ops, torch.float32,
                                             operand_dtype=dtype, with_parts=False)
        else:
            self.wkv = make_linear(weights, "wkv", ops, dtype, shape)
        self.norm = weights.get("norm.weight", (cfg.head_dim,))

    def __call__(self, x: torch.Tensor, new: Compression, state: Ring | None) -> torch.Tensor:
        """x [T, H]: the step's rows -> latents [M, head_dim] of the groups this step completes.

        The latents are the normed, pre-RoPE compressed vectors, in `new`'s entry order.
        """
        if self.ratio == 1:
            return self.ops.rms_norm(self.wkv(x), self.norm, self.eps)
        gate_value = self.gate_kv.stacked(x)  # [T, 2D] float32
        pooled = self.ops.compressor_update(
            gate_value, state.data, new.sources, new.state_dest, new.state_src
        )
        return self.ops.rms_norm(pooled.to(self.dtype), self.norm, self.eps)
