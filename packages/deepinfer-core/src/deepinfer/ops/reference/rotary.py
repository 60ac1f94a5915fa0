"""Interleaved (adjacent-pair) rotary embedding on the last channels of a vector (model spec §6.3)."""

from __future__ import annotations

import torch

from deepinfer.ops.reference.norm import rms_norm


def rope_interleaved(
    x: torch.Tensor, angles: torch.Tensor, inverse: bool = False, *, inplace: bool = False
) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last 2*P channels of x [N, ..., D] by angles [N, P] (float32).

    The rotation is a complex multiply in float32 (the released rounding); other channels pass through.
    `inverse` applies the conjugate rotation (undoing RoPE on attention outputs). `inplace`: the rotated
    channels are written back into x (a view of any strides) and x is returned: the same values, without
    copying the D - 2P channels that pass through (callers whose x is read by nothing else).
    """
    rot = 2 * angles.shape[-1]
    # an unconditional copy (not .contiguous()) keeps the op sequence independent of the batch size
    pairs = x[..., -rot:].float().unflatten(-1, (-1, 2)).clone(memory_format=torch.contiguous_format)
    pairs = torch.view_as_complex(pairs)
    phase = torch.polar(torch.ones_like(angles), angles)
    phase = phase.view(phase.shape[0], *([1] * (pairs.ndim - 2)), phase.shape[-1])
    if inverse:
        phase = phase.conj()
    rotated = torch.view_as_real(pairs * phase).flatten(-2).to(x.dtype)
    if inplace:
        x[..., -rot:] = rotated
        return x
    return torch.cat((x[..., :-rot], rotated), dim=-1)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, angles: torch.Tensor) -> torch.Tensor:
    """RMSNorm of rows x [N, D] (output in x's dtype), then interleaved RoPE by angles [N, P] on the
    result: the key projections' epilogue, one op so that a backend can do both in one pass."""
    return rope_interleaved(rms_norm(x, weight, eps), angles)
