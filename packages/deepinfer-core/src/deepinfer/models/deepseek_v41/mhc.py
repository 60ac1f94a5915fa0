"""Shifted (single-pass) mHC residual: 4 streams per token, coefficients per sub-layer.

A sub-layer collapses the streams with the `pre` computed by the sub-layer before it, runs, and
writes R'[k] = post[k] * y + sum_j comb[j, k] R[j]; its own `pre` is carried to the next one.
The first sub-layer's carried pre is one-hot on stream 0, so its input is exactly the embedding: it is
passed as None (the collapse is stream 0 itself, bitwise), so no coefficient tensor is built for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.config import TextConfig
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops


@dataclass(frozen=True)
class Mix:
    pre: torch.Tensor  # [T, m] float32, carried to the next sub-layer
    post: torch.Tensor  # [T, m] float32
    comb: torch.Tensor  # [T, m_in, m_out] float32


@dataclass
class HyperConnection:
    """One sub-layer's coefficient predictor (`hc_attn_*` or `hc_ffn_*`)."""

    fn: torch.Tensor  # [m(m+2), m*H] float32, norm weight folded in
    base: torch.Tensor  # [m(m+2)]
    scale: torch.Tensor  # [3]
    cfg: TextConfig
    ops: Ops

    @classmethod
    def load(cls, w: Weights, name: str, cfg: TextConfig, ops: Ops) -> HyperConnection:
        m, h = cfg.hc_mult, cfg.hidden_size
        width = m * (m + 2)
        return cls(
            w.get(f"{name}_fn", (width, m * h)),
            w.get(f"{name}_base", (width,)),
            w.get(f"{name}_scale", (3,)),
            cfg,
            ops,
        )

    def __call__(self, streams: torch.Tensor) -> Mix:
        c = self.cfg
        pre, post, comb = self.ops.hc_coefficients(
            streams, self.fn, self.base, self.scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps
        )
        return Mix(pre, post, comb)

    def collapse(self, streams: torch.Tensor, pre: torch.Tensor | None) -> torch.Tensor:
        """Collapse with the carried pre (None: one-hot on stream 0)."""
        return streams[:, 0] if pre is None else self.ops.hc_collapse(streams, pre)

    def collapse_norm(
        self, streams: torch.Tensor, pre: torch.Tensor | None, weight: torch.Tensor
    ) -> torch.Tensor:
        """RMSNorm (weight) of the collapse: a sub-layer's input, or the final hidden state."""
        eps = self.cfg.rms_norm_eps
        if pre is None:
            return self.ops.rms_norm(streams[:, 0], weight, eps)
        return self.ops.hc_collapse_norm(streams, pre, weight, eps)

    def expand(self, y: torch.Tensor, streams: torch.Tensor, mix: Mix) -> torch.Tensor:
        return self.ops.hc_expand(y, streams, mix.post, mix.comb)

    def residual(self, y: torch.Tensor, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(new streams, carried pre): this sub-layer's coefficients from the streams entering it and its
        output y expanded into them, in one op (`expand` with `__call__`'s mix)."""
        c = self.cfg
        return self.ops.hc_residual(
            y, streams, self.fn, self.base, self.scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps
        )


def initial_streams(embedding: torch.Tensor, m: int) -> tuple[torch.Tensor, None]:
    """Streams [T, m, H] (the embedding copied m times) and the carried pre: None (one-hot on stream 0)."""
    return embedding.unsqueeze(1).expand(-1, m, -1).contiguous(), None
