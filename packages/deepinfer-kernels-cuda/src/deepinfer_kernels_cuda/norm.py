"""RMSNorm: one program per row, float32 accumulation, output in the input dtype."""

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_values(x, w, n_cols, eps):
    """float32 row x [BLOCK] (zeros past n_cols) normalised and scaled by w: the one definition of this
    op's values (fused callers hand it a row they computed)."""
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    return x * inv_rms * w


@triton.jit
def rms_norm_row(x_ptr, w_ptr, row, n_cols, x_stride, eps, BLOCK: tl.constexpr):
    """Row `row` normalised, float32 [BLOCK] (zeros past n_cols)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return rms_norm_values(x, w, n_cols, eps)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, x_stride, out_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    y = rms_norm_row(x_ptr, w_ptr, row, n_cols, x_stride, eps, BLOCK)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def row_warps(block: int) -> int:
    """Warps of a one-row program over `block` columns (fused callers use it too: the same reduction
    tree, so the same bits as this op)."""
    return min(max(block // 256, 1), 16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty_like(x2)
    block = triton.next_power_of_2(shape[-1])
    _rms_norm_kernel[(x2.shape[0],)](
        x2, weight, out, shape[-1], x2.stride(0), out.stride(0), eps, BLOCK=block, num_warps=row_warps(block),
    )
    return out.reshape(shape)
