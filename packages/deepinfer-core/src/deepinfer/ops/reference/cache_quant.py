"""Cache quantisation boundaries of the release (model spec §6.9): encode to stored bytes, decode back.

Groups run over the last dimension. Scales follow the spec exactly:
* FP8 window KV: E4M3 elements, UE8M0 scale pow2ceil(max(amax, 1e-4) / 448) per 32.
* NVFP4 compressed KV: E2M1 elements, E4M3 scale E4M3(min(max(amax, 6 * 2^-9) / 6, 448)) per 16.
* MXFP4 indexer Q/K: E2M1 elements, UE8M0 scale pow2ceil(max(amax, 6 * 2^-126) / 6) per 32.
E2M1 codes and nibble packing are the checkpoint's (even element in the low nibble).
UE8M0 scales multiply amax by the reciprocal of the code maximum, as the released kernels do: it can
differ from a division in the last bit, which decides pow2ceil when the quotient is near a power of two.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from deepinfer.checkpoint.formats import (
    E2M1_MAX,
    E4M3_MAX,
    e2m1_encode,
    pack_fp4,
    ue8m0_exponent_ceil,
    ue8m0_to_float,
    unpack_fp4,
)

if TYPE_CHECKING:
    from deepinfer.cache.codecs import Codec

FP8_GROUP = 32
NVFP4_GROUP = 16
MXFP4_GROUP = 32


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    if x.shape[-1] % group:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of the quantisation group {group}")
    return x.float().unflatten(-1, (-1, group))


def fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., D] -> (E4M3 elements [..., D], UE8M0 exponent bytes uint8 [..., D/32])."""
    g = _groups(x, FP8_GROUP)
    exp = ue8m0_exponent_ceil(g.abs().amax(-1, keepdim=True).clamp_min(1e-4) * (1 / E4M3_MAX))
    q = (g / ue8m0_to_float(exp)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.flatten(-2), exp.squeeze(-1)


def fp8_dequantize(q: torch.Tensor, exp: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    g = q.float().unflatten(-1, (-1, FP8_GROUP)) * ue8m0_to_float(exp).unsqueeze(-1)
    return g.flatten(-2).to(dtype)


def nvfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., D] -> (packed E2M1 uint8 [..., D/2], E4M3 scales [..., D/16])."""
    g = _groups(x, NVFP4_GROUP)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(E2M1_MAX * 2**-9)
    # a true division on every device (CUDA multiplies by a rounded reciprocal for a Python-scalar divisor)
    # and an explicit E4M3 saturation (casts of out-of-range values differ between devices)
    scale = (amax / amax.new_full((), E2M1_MAX)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    codes = e2m1_encode(g / scale.float())  # saturates at ±6, like the spec's clamp
    return pack_fp4(codes.flatten(-2)).view(torch.uint8), scale.squeeze(-1)


def nvfp4_dequantize(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    g = unpack_fp4(packed).unflatten(-1, (-1, NVFP4_GROUP)) * scale.float().unsqueeze(-1)
    return g.flatten(-2).to(dtype)


def mxfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., D] -> (packed E2M1 uint8 [..., D/2], UE8M0 exponent bytes uint8 [..., D/32])."""
    g = _groups(x, MXFP4_GROUP)
    exp = ue8m0_exponent_ceil(g.abs().amax(-1, keepdim=True).clamp_min(E2M1_MAX * 2**-126) * (1 / E2M1_MAX))
    codes = e2m1_encode(g / ue8m0_to_float(exp))
    return pack_fp4(codes.flatten(-2)).view(torch.uint8), exp.squeeze(-1)


def mxfp4_dequantize(packed: torch.Tensor, exp: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    g = unpack_fp4(packed).unflatten(-1, (-1, MXFP4_GROUP)) * ue8m0_to_float(exp).unsqueeze(-1)
    return g.flatten(-2).to(dtype)


def cache_write(pool: torch.Tensor, dest: torch.Tensor, values: torch.Tensor, codec: Codec) -> None:
    """Encode values [n, dim] with `codec` and store them in pool [A, E, nbytes] uint8 (a paged region,
    or a ring region of slots): flat row dest[i] = a * E + e (long [n]) receives row i at pool[a, e]."""
    per = pool.shape[1]
    pool.index_put_((dest // per, dest % per), codec.encode(values, QUANT_OPS))


# The quantisation ops by name, for codecs used inside other reference ops (a kernel backend replaces
# the whole outer op, so these inner calls stay reference).
QUANT_OPS = SimpleNamespace(
    fp8_quantize=fp8_quantize, fp8_dequantize=fp8_dequantize, nvfp4_quantize=nvfp4_quantize,
    nvfp4_dequantize=nvfp4_dequantize, mxfp4_quantize=mxfp4_quantize, mxfp4_dequantize=mxfp4_dequantize,
)
