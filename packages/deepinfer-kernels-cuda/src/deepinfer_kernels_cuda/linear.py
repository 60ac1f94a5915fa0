"""Block-scaled linears: y = x W^T with W in its release storage, decoded tile by tile in registers.

One Triton kernel serves FP8 (32x32 UE8M0 blocks) and packed FP4 (1x32 UE8M0 groups) weights, plain or
grouped (the o-projection: group g of the output rows reads input chunk g), in one launch. Orientation
is swap-AB: the decoded weight tile is the MMA's register A operand (BLOCK_N weight rows on the M side,
which Hopper's wgmma needs >= 64 of), tokens are its N side, so M=1 decode wastes no weight bandwidth.
Small M splits K across programs (float32 partials, then a fixed-order reduction: deterministic).

Up to `configs.GEMV_M` tokens (decode) a GEMV kernel replaces the MMA: each weight byte is loaded once
with 16-byte accesses straight into registers, decoded and multiplied on the CUDA cores, with no
shared-memory staging of the weight or operand-layout shuffles.

Why BF16 MMA and not FP8 MMA: the reference multiplies unquantised (BF16) activations by the decoded
weights; FP8 MMA would need per-token-per-32 activation quantisation, which changes the numerics, and
32-column scale promotion on every K step. Decoding to BF16 is exact (power-of-two scales), so this
kernel equals the reference up to float32 summation order.

Dense (BF16/F32) weights, including the LM head, go to cuBLAS through torch: it already streams a
BF16 weight near copy bandwidth at M=1 and is at its MMA peak at large M, and `torch.mm(out_dtype=)`
gives the float32 logits from BF16 operands without the reference's float32 copy of the weight.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from deepinfer.ops.reference import linear as reference_linear
from deepinfer_kernels_cuda import configs
from deepinfer_kernels_cuda.dequant import GROUP, fp4_group_tile, fp8_tile

Kind = Literal["fp8", "fp4", "dense"]
_BLOCK_ROWS = tl.constexpr(GROUP)  # FP8 weights: one scale per 32x32 block
_KIND_CODE = {"fp8": 0, "fp4": 1}
# torch.mm(..., out_dtype=) (aten::mm.dtype): BF16 operands, float32 accumulation and output
_MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()


@dataclass(frozen=True)
class PreparedLinear:
    """A weight in the kernel's layout: contiguous storage, scales as uint8 exponent bytes."""

    kind: Kind
    weight: torch.Tensor  # fp8 [N, K] | uint8 packed FP4 [N, K/2] | dense [N, K]
    scale: torch.Tensor | None  # uint8 [N/32, K/32] (fp8) | [N, K/32] (fp4)
    groups: int
    out_features: int
    in_features: int  # per group


def prepare_linear(
    kind: Kind, weight: torch.Tensor, scale: torch.Tensor | None, groups: int = 1
) -> PreparedLinear:
    if kind not in ("fp8", "fp4", "dense"):
        raise ValueError(f"linear kind {kind!r}: expected 'fp8', 'fp4' or 'dense'")
    if weight.ndim != 2:
        raise ValueError(f"{kind} weight: rank {weight.ndim}, expected [out, in]")
    n = weight.shape[0]
    k = weight.shape[1] * (2 if kind == "fp4" else 1)
    if groups < 1 or n % groups:
        raise ValueError(f"{kind} weight: {n} output rows do not split into {groups} groups")
    if kind == "dense":
        if scale is not None:
            raise ValueError("dense weight: unexpected scale")
        return PreparedLinear(kind, weight.contiguous(), None, groups, n, k)
    if scale is None:
        raise ValueError(f"{kind} weight: missing scale")
    if k % GROUP or (kind == "fp8" and (n // groups) % GROUP):
        # partial 32-blocks (only tiny test configs have them; every Flash width is a multiple of 32):
        # the tiles assume whole scale blocks, so such a weight stays on the reference path
        return reference_linear.prepare_linear(kind, weight, scale, groups)
    want_scale = (-(-n // GROUP), k // GROUP) if kind == "fp8" else (n, k // GROUP)
    if tuple(scale.shape) != want_scale:
        raise ValueError(f"{kind} scale: shape {tuple(scale.shape)}, expected {want_scale}")
    if kind == "fp8" and weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8 weight: dtype {weight.dtype}, expected float8_e4m3fn")
    if kind == "fp4" and weight.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"fp4 weight: dtype {weight.dtype}, expected packed int8/uint8")
    w = weight.contiguous() if kind == "fp8" else weight.contiguous().view(torch.uint8)
    return PreparedLinear(kind, w, scale.contiguous().view(torch.uint8), groups, n, k)


def compute_dtype(x_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype:
    """MMA operand dtype: out_dtype, except float32 outputs of BF16 inputs keep BF16 operands (every
    decoded weight is exact in BF16 and products accumulate in float32, as in the reference)."""
    if out_dtype == torch.float32 and x_dtype == torch.bfloat16:
        return torch.bfloat16
    return out_dtype


@triton.jit
def _block_linear_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K, rows_per_group, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_om, stride_split,
    KIND: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    n_mask = offs_n < N
    m_mask = offs_m < M
    x_col = (pid_n * BN // rows_per_group) * K  # the group's input chunk (BN divides rows_per_group)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        offs_k = k0 + tl.arange(0, BK)
        xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + (x_col + offs_k)[:, None], mask=m_mask[None, :],
                     other=0.0)
        if KIND == 0:
            w = fp8_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK, _BLOCK_ROWS)
        else:
            w = fp4_group_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK)
        acc = tl.dot(w.to(xt.dtype), xt, acc, input_precision="ieee" if IEEE else None)
    ptrs = out_ptr + pid_k * stride_split + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K, rows_per_group, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_om, stride_split,
    KIND: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_mask = offs_n < N
    offs_m = tl.arange(0, BM)
    m_mask = offs_m < M
    x_rows = x_ptr + offs_m[:, None] * stride_xm + (pid_n * BN // rows_per_group) * K
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    # elementwise products accumulate across K steps; one reduction at the end
    acc = tl.zeros((BN, BM, BK), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        if KIND == 0:
            w = fp8_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK, _BLOCK_ROWS)
        else:
            w = fp4_group_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK).to(tl.float32)
        xt = tl.load(x_rows + (k0 + tl.arange(0, BK))[None, :], mask=m_mask[:, None], other=0.0)
        acc += w[:, None, :] * xt.to(tl.float32)[None, :, :]
    ptrs = out_ptr + pid_k * stride_split + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(ptrs, tl.sum(acc, axis=2).to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def _split_reduce_kernel(part_ptr, out_ptr, numel, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):  # fixed order: the same bits every run
        acc += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def block_linear(
    x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype, config: configs.TileConfig | None = None
) -> torch.Tensor:
    """x [M, groups * K] -> [M, N] for a prepared fp8/fp4 weight (`config` overrides the table)."""
    m = x.shape[0]
    n, k = w.out_features, w.in_features
    x = x.to(compute_dtype(x.dtype, out_dtype))
    if x.stride(-1) != 1:
        x = x.contiguous()
    cfg = config or configs.lookup(w.kind, n, k, m, x.device)
    if x.dtype == torch.float32:  # float32 operands (tiny test configs) take 2x the shared memory per stage
        cfg = replace(cfg, block_k=min(cfg.block_k, 64), num_stages=min(cfg.num_stages, 2))
    rows_per_group = n // w.groups
    if w.groups > 1 and rows_per_group % cfg.block_n:  # a tile must not straddle two groups
        cfg = replace(cfg, block_n=rows_per_group & -rows_per_group)  # largest power of two dividing it
    min_rows = 1 if m <= configs.GEMV_M else 16  # the MMA tile needs 16 rows, the GEMV any
    if cfg.block_n < min_rows:
        raise ValueError(f"grouped linear: {rows_per_group} rows per group leave no tile of >= {min_rows}")
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    steps = k // cfg.block_k
    split = min(cfg.split_k, steps)
    k_per_split = -(-steps // split) * cfg.block_k
    split = -(-k // k_per_split)
    target = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    args = (x, w.weight, w.scale, target, m, n, k, rows_per_group, k_per_split,
            x.stride(0), w.weight.stride(0), w.scale.stride(0), n, m * n)
    if m <= configs.GEMV_M:
        _gemv_kernel[(triton.cdiv(n, cfg.block_n), split)](
            *args, KIND=_KIND_CODE[w.kind], BN=cfg.block_n, BM=triton.next_power_of_2(m), BK=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    else:
        _block_linear_kernel[(triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), split)](
            *args, KIND=_KIND_CODE[w.kind], BN=cfg.block_n, BM=cfg.block_m, BK=cfg.block_k,
            IEEE=x.dtype == torch.float32, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    if split > 1:
        block = 1024
        _split_reduce_kernel[(triton.cdiv(m * n, block),)](target, out, m * n, SPLIT=split, BLOCK=block)
    return out


def dense_linear(x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype) -> torch.Tensor:
    weight = w.weight
    if w.groups > 1:
        g = w.groups
        xg = x.reshape(x.shape[0], g, -1).transpose(0, 1).to(out_dtype)
        wg = weight.reshape(g, -1, weight.shape[1]).to(out_dtype)
        return torch.bmm(xg, wg.transpose(1, 2)).transpose(0, 1).reshape(x.shape[0], -1)
    return mm_out(x, weight, out_dtype)


def mm_out(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """x weight^T in out_dtype; float32 results of BF16 operands without float32 copies of them (equal to
    the reference's float32 product up to summation order: BF16 products are exact in float32)."""
    bf16 = x.dtype == weight.dtype == torch.bfloat16
    if out_dtype == torch.float32 and bf16 and x.is_cuda and _MM_OUT_DTYPE:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.to(out_dtype), weight.to(out_dtype))


def linear(
    x: torch.Tensor, prepared: PreparedLinear | reference_linear.ReferenceLinear, out_dtype: torch.dtype
) -> torch.Tensor:
    """y = x W^T in `out_dtype` for a weight from `prepare_linear`; x [..., groups * in]."""
    if isinstance(prepared, reference_linear.ReferenceLinear):
        return reference_linear.linear(x, prepared, out_dtype)
    lead = x.shape[:-1]
    if x.shape[-1] != prepared.groups * prepared.in_features:
        raise ValueError(
            f"linear input width {x.shape[-1]}, expected {prepared.groups} x {prepared.in_features}"
        )
    x2 = x.reshape(-1, x.shape[-1])
    if prepared.kind == "dense":
        y = dense_linear(x2, prepared, out_dtype)
    else:
        y = block_linear(x2, prepared, out_dtype)
    return y.reshape(*lead, prepared.out_features)
