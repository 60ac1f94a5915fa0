"""Interleaved RoPE: one pass that copies the leading channels and rotates the trailing 2P (or, in
place, one that reads and writes only the trailing 2P: a query head of 512 channels moves 1/8 of the bytes).

A row is viewed as D/2 channel pairs; pairs before the rotary part get the identity rotation
(cos 1, sin 0, exact in float32), so one code path writes the whole row. cos/sin are libdevice's
cosf/sinf of the float32 angle, computed in the kernel (one launch per call instead of three): the
CUDA math library's accurate functions, which torch's cos/sin (and so torch.polar in the reference)
also call (tl.cos/tl.sin may lower to approximations that are poor at large angles; the interpreter
has no libdevice and uses numpy's); the complex multiply runs in float32.

`rms_norm_rope` puts norm.py's RMSNorm in front of the rotation in the same program (the key
projections' epilogue: one launch instead of two, the same values as the two ops; BF16/FP16 rows only:
float32 rows take the two kernels, see `rms_norm_rope`).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from deepinfer_kernels_cuda.norm import rms_norm, rms_norm_row


@triton.jit
def _cos_sin(angle, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        c, s = libdevice.cos(angle), libdevice.sin(angle)
    else:
        c, s = tl.cos(angle), tl.sin(angle)
    return c, s


@triton.jit
def _rotate(tile, c, s, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    """tile [BLOCK_R, 2 * BLOCK_P] as float32 with channel pair p turned by (c[p], s[p])."""
    a, b = tl.split(tl.reshape(tile.to(tl.float32), (BLOCK_R, BLOCK_P, 2)))
    re = a * c[None, :] - b * s[None, :]
    im = a * s[None, :] + b * c[None, :]
    return tl.reshape(tl.join(re, im), (BLOCK_R, 2 * BLOCK_P))


def _blocks(pairs: int, rows: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_R) of the rope kernels: every pair of a row, rows up to 4096 pairs a program."""
    block_p = triton.next_power_of_2(pairs)
    return block_p, max(1, min(triton.next_power_of_2(rows), 4096 // block_p))


# row counts are not specialised (== 1, multiple of 16): a new batch size compiles no new kernel
@triton.jit(do_not_specialize=["rows"])
def _rope_kernel(
    x_ptr, angle_ptr, out_ptr, rows, pairs, first_rot, x_stride_n, x_stride_r,
    SIGN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, LIBDEVICE: tl.constexpr,
):
    n = tl.program_id(0)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    p = tl.arange(0, BLOCK_P)
    rot = p - first_rot
    has_rot = (rot >= 0) & (p < pairs)
    angle = tl.load(angle_ptr + n * (pairs - first_rot) + rot, mask=has_rot, other=0.0)  # cos 1, sin 0
    c, s = _cos_sin(angle, LIBDEVICE)
    s = SIGN * s
    ch = tl.arange(0, 2 * BLOCK_P)
    mask = (r < rows)[:, None] & (ch < 2 * pairs)[None, :]
    offs = n.to(tl.int64) * x_stride_n + r[:, None].to(tl.int64) * x_stride_r + ch[None, :]
    # whole rows in one contiguous load (vectorised), split into the pairs' halves in registers
    out = _rotate(tl.load(x_ptr + offs, mask=mask, other=0.0), c, s, BLOCK_R, BLOCK_P)
    out = out.to(out_ptr.dtype.element_ty)
    ooffs = (n * rows + r[:, None]).to(tl.int64) * (2 * pairs) + tl.arange(0, 2 * BLOCK_P)[None, :]
    omask = (r < rows)[:, None] & (tl.arange(0, 2 * BLOCK_P) < 2 * pairs)[None, :]
    tl.store(out_ptr + ooffs, out, mask=omask)


# in place: only the rotated pairs are read and written, in their rows' places (any strides)
@triton.jit(do_not_specialize=["rows"])
def _rope_inplace_kernel(
    x_ptr, angle_ptr, rows, rot_pairs, first_ch, x_stride_n, x_stride_r,
    SIGN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, LIBDEVICE: tl.constexpr,
):
    n = tl.program_id(0)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    p = tl.arange(0, BLOCK_P)
    angle = tl.load(angle_ptr + n * rot_pairs + p, mask=p < rot_pairs, other=0.0)
    c, s = _cos_sin(angle, LIBDEVICE)
    s = SIGN * s
    ch = tl.arange(0, 2 * BLOCK_P)
    mask = (r < rows)[:, None] & (ch < 2 * rot_pairs)[None, :]
    offs = n.to(tl.int64) * x_stride_n + r[:, None].to(tl.int64) * x_stride_r + first_ch + ch[None, :]
    out = _rotate(tl.load(x_ptr + offs, mask=mask, other=0.0), c, s, BLOCK_R, BLOCK_P)
    out = out.to(x_ptr.dtype.element_ty)
    tl.store(x_ptr + offs, out, mask=mask)


def _rope_inplace(x: torch.Tensor, angles: torch.Tensor, inverse: bool) -> torch.Tensor:
    n, d, rot_pairs = x.shape[0], x.shape[-1], angles.shape[-1]
    try:
        x3 = x.view(n, -1, d)  # a view, so that the kernel writes x itself
    except RuntimeError:
        x3 = None
    if x3 is None or x3.stride(-1) != 1:  # x's rows cannot be addressed as [N, rows, D]: out of place
        x.copy_(rope_interleaved(x, angles, inverse))
        return x
    rows = x3.shape[1]
    block_p, block_r = _blocks(rot_pairs, rows)
    _rope_inplace_kernel[(n, triton.cdiv(rows, block_r))](
        x3, angles.float().contiguous(), rows, rot_pairs, d - 2 * rot_pairs, x3.stride(0), x3.stride(1),
        SIGN=-1.0 if inverse else 1.0, BLOCK_R=block_r, BLOCK_P=block_p, LIBDEVICE=x.is_cuda, num_warps=4,
    )
    return x


def rope_interleaved(
    x: torch.Tensor, angles: torch.Tensor, inverse: bool = False, *, inplace: bool = False
) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last 2*P channels of x [N, ..., D] by angles [N, P] (float32).
    `inplace`: into x itself (any strides; only the 2P rotated channels are read and written), the
    same values; x is returned."""
    n, d, rot_pairs = x.shape[0], x.shape[-1], angles.shape[-1]
    if d % 2 or 2 * rot_pairs > d or angles.shape[0] != n:
        raise ValueError(f"rope: x {tuple(x.shape)} cannot take angles {tuple(angles.shape)}")
    if inplace:
        return _rope_inplace(x, angles, inverse) if x.numel() and rot_pairs else x
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:  # e.g. a step that completes no compressor group
        return out
    x3 = x.reshape(n, -1, d)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    rows, pairs = x3.shape[1], d // 2
    angles = angles.float().contiguous()
    block_p, block_r = _blocks(pairs, rows)
    grid = (n, triton.cdiv(rows, block_r))
    _rope_kernel[grid](
        x3, angles, out, rows, pairs, pairs - rot_pairs,
        x3.stride(0), x3.stride(1), SIGN=-1.0 if inverse else 1.0, BLOCK_R=block_r, BLOCK_P=block_p,
        LIBDEVICE=x.is_cuda, num_warps=4,
    )
    return out


@triton.jit
def _rms_norm_rope_kernel(
    x_ptr, w_ptr, angle_ptr, out_ptr, n_cols, first_rot, x_stride, eps,
    BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # the norm exactly as norm.py's kernel computes it, rounded to the output dtype as the separate op's
    # result would be, then rotated as _rope_kernel does
    y = rms_norm_row(x_ptr, w_ptr, row, n_cols, x_stride, eps, BLOCK).to(out_ptr.dtype.element_ty)
    y = y.to(tl.float32)
    a, b = tl.split(tl.reshape(y, (BLOCK // 2, 2)))
    p = tl.arange(0, BLOCK // 2)
    rot = p - first_rot
    has_rot = (rot >= 0) & (2 * p < n_cols)
    angle = tl.load(angle_ptr + row * (n_cols // 2 - first_rot) + rot, mask=has_rot, other=0.0)
    c, s = _cos_sin(angle, LIBDEVICE)
    out = tl.reshape(tl.join(a * c - b * s, a * s + b * c), (BLOCK,))
    tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, angles: torch.Tensor) -> torch.Tensor:
    """rope_interleaved(rms_norm(x, weight, eps), angles) for rows x [N, D] in one pass (one program per
    row, launch config from D only: row-wise)."""
    if x.ndim != 2 or x.shape[-1] % 2 or angles.ndim != 2 or angles.shape[0] != x.shape[0] \
            or 2 * angles.shape[-1] > x.shape[-1] or weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm_rope: x {tuple(x.shape)} (rows of even width), weight "
                         f"{tuple(weight.shape)}, angles {tuple(angles.shape)} do not fit")
    if x.dtype == torch.float32:
        # on the H200 (2026-12-02) the fused pass differed from the two kernels in float32 (some rotated
        # pairs turned by another angle; bf16 bitwise equal): two launches until that is understood
        return rope_interleaved(rms_norm(x, weight, eps), angles)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    d = x.shape[-1]
    block = triton.next_power_of_2(d)
    _rms_norm_rope_kernel[(x.shape[0],)](
        x, weight, angles.float().contiguous(), out, d, d // 2 - angles.shape[-1], x.stride(0), eps,
        BLOCK=block, LIBDEVICE=x.is_cuda, num_warps=min(max(block // 256, 1), 16),
    )
    return out
