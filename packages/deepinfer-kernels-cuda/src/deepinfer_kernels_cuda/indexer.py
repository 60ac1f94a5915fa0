"""Lightning-indexer scores: I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]), float32 [T, N].

One program scores BLOCK_T query rows (all heads: a [BLOCK_T*heads, D] tile, so each key tile is
read once per BLOCK_T rows) against BLOCK_N keys with one tensor-core product. Like the reference,
each head's dot product and weighted term are rounded to the input dtype before the float32 sum
over heads. The dot itself accumulates in float32 in another order than the reference's matmul, so
a per-head term can land one ulp of the input dtype away (2^-8 relative in BF16) when its float32
value sits near a rounding boundary: the scores agree to 2^-8 * sum_h |w_h relu(q_h . k)|.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _indexer_logits_kernel(
    q_ptr, k_ptr, w_ptr, out_ptr, T, N, D, q_stride_t, q_stride_h, k_stride, w_stride_t,
    HEADS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    r = tl.arange(0, BLOCK_T * HEADS)
    t = tl.program_id(0) * BLOCK_T + r // HEADS
    h = r % HEADS
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + t[:, None].to(tl.int64) * q_stride_t + h[:, None] * q_stride_h + d[None, :],
                mask=(t < T)[:, None] & (d < D)[None, :], other=0.0)
    k = tl.load(k_ptr + n[:, None].to(tl.int64) * k_stride + d[None, :],
                mask=(n < N)[:, None] & (d < D)[None, :], other=0.0)
    ty = q_ptr.dtype.element_ty
    dots = tl.maximum(tl.dot(q, tl.trans(k), input_precision=PRECISION).to(ty).to(tl.float32), 0.0)
    w = tl.load(w_ptr + t.to(tl.int64) * w_stride_t + h, mask=t < T, other=0.0).to(tl.float32)
    terms = (dots * w[:, None]).to(ty).to(tl.float32)
    scores = tl.sum(tl.reshape(terms, (BLOCK_T, HEADS, BLOCK_N)), axis=1)
    tt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tl.store(out_ptr + tt[:, None].to(tl.int64) * N + n[None, :], scores,
             mask=(tt < T)[:, None] & (n < N)[None, :])


def indexer_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """q [T, heads, D], k [N, D], weights [T, heads] -> float32 [T, N]."""
    t, heads, d = q.shape
    if k.shape[-1] != d or weights.shape != (t, heads):
        raise ValueError(f"indexer_logits: q {tuple(q.shape)}, k {tuple(k.shape)}, weights "
                         f"{tuple(weights.shape)} do not fit")
    if heads & (heads - 1):
        raise ValueError(f"indexer_logits needs a power-of-two head count, got {heads}")
    n = k.shape[0]
    out = torch.empty(t, n, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    k = k.to(q.dtype).contiguous()
    weights = weights.to(q.dtype).contiguous()
    # at least 16 MMA rows; at most 4 query rows (128 rows at 32 heads)
    min_rows = triton.next_power_of_2(triton.cdiv(16, heads))
    block_t = max(min_rows, min(triton.next_power_of_2(t), 128 // heads, 4))
    block_n = 64
    grid = (triton.cdiv(t, block_t), triton.cdiv(n, block_n))
    _indexer_logits_kernel[grid](
        q, k, weights, out, t, n, d, q.stride(0), q.stride(1), k.stride(0), weights.stride(0),
        HEADS=heads, BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4,
    )
    return out
