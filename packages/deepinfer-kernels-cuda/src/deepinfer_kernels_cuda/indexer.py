"""Lightning-indexer scores: I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]), float32 [T, N].

One program scores BLOCK_T query rows (all heads: a [BLOCK_T*heads, D] tile, so each key tile is
read once per BLOCK_T rows) against BLOCK_N keys with one tensor-core product. Like the reference,
each head's dot product and weighted term are rounded to the input dtype before the float32 sum
over heads. The dot itself accumulates in float32 in another order than the reference's matmul, so
a per-head term can land one ulp of the input dtype away (2^-8 relative in BF16) when its float32
value sits near a rounding boundary: the scores agree to 2^-8 * sum_h |w_h relu(q_h . k)|.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from deepinfer.ops.reference.indexer import candidate_blocks
from deepinfer_kernels_cuda.cache_quant import cache_region, decode_rows

if TYPE_CHECKING:
    from deepinfer.cache.codecs import Codec


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


def indexer_logits(
    q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, *, batch_invariant: bool = False
) -> torch.Tensor:
    """q [T, heads, D], k [N, D], weights [T, heads] -> float32 [T, N]. `batch_invariant`: the same
    query rows per program (the MMA tile height) for any T."""
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
    rows = 128 if batch_invariant else triton.next_power_of_2(t)
    block_t = max(min_rows, min(rows, 128 // heads, 4))
    block_n = 64
    grid = (triton.cdiv(t, block_t), triton.cdiv(n, block_n))
    _indexer_logits_kernel[grid](
        q, k, weights, out, t, n, d, q.stride(0), q.stride(1), k.stride(0), weights.stride(0),
        HEADS=heads, BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4,
    )
    return out


@triton.jit
def _paged_scores_kernel(
    q_ptr, w_ptr, pool_ptr, pool_s0, pool_s1, per_block, bt_ptr, bt_stride, seg_ptr, visible_ptr, out_ptr,
    heads, D, capacity, q_stride_t, q_stride_h, w_stride_t,
    FMT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Scores of one row against BLOCK_N entries of its sequence's keys (paged, decoded in registers);
    -inf past the row's visible count."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    seq = tl.load(seg_ptr + t).to(tl.int64)
    valid = n < tl.load(visible_ptr + t)
    j = tl.where(valid, n, 0).to(tl.int64)
    block = tl.load(bt_ptr + seq * bt_stride + j // per_block, mask=valid, other=0).to(tl.int64)
    ty = q_ptr.dtype.element_ty
    k = decode_rows(pool_ptr, block * pool_s0 + (j % per_block) * pool_s1, valid, 0, D, FMT, BLOCK_D, ty)
    q = tl.load(q_ptr + t.to(tl.int64) * q_stride_t + h[:, None] * q_stride_h + d[None, :],
                mask=(h < heads)[:, None] & (d < D)[None, :], other=0.0)
    dots = tl.maximum(tl.dot(q, tl.trans(k), input_precision=PRECISION).to(ty).to(tl.float32), 0.0)
    w = tl.load(w_ptr + t.to(tl.int64) * w_stride_t + h, mask=h < heads, other=0.0).to(tl.float32)
    scores = tl.sum((dots * w[:, None]).to(ty).to(tl.float32), axis=0)
    scores = tl.where(valid, scores, -float("inf"))
    tl.store(out_ptr + t.to(tl.int64) * capacity + n, scores, mask=n < capacity)


@triton.jit
def _order_key(s):
    """float32 -> uint32 whose unsigned order is the float order (larger score, larger key)."""
    bits = s.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)


@triton.jit
def _topk_kernel(
    scores_ptr, allowed_ptr, out_ptr, capacity, k,
    HAS_ALLOWED: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Per row: the k largest finite (and allowed) scores by an exact 4-pass radix select on 8-bit
    digits of the order key, ties broken by the lowest entry id; ids ascending, then -1 padding."""
    t = tl.program_id(0)
    row = scores_ptr + t.to(tl.int64) * capacity
    bins = tl.arange(0, 512)  # 256 digits + an overflow range for elements outside the prefix
    prefix = tl.zeros((), tl.uint32)
    remaining = tl.zeros((), tl.int32)
    for p in tl.static_range(4):
        shift = 24 - 8 * p  # a compile-time constant: p is unrolled
        hist = tl.zeros((512,), tl.int32)
        for c0 in range(0, capacity, BLOCK):
            i = c0 + tl.arange(0, BLOCK)
            s = tl.load(row + i, mask=i < capacity, other=-float("inf"))
            ok = s > -float("inf")
            if HAS_ALLOWED:
                ok &= tl.load(allowed_ptr + t.to(tl.int64) * capacity + i, mask=i < capacity, other=0) != 0
            key = _order_key(s)
            if p > 0:
                ok &= (key >> (shift + 8)) == (prefix >> (shift + 8))
            hist += tl.histogram(tl.where(ok, (key >> shift) & 0xFF, 256).to(tl.int32), 512)
        hist = tl.where(bins < 256, hist, 0)
        if p == 0:
            remaining = tl.minimum(k, tl.sum(hist, axis=0))
        at_least = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # elements with digit >= bin
        digit = tl.max(tl.where((bins < 256) & (at_least >= remaining), bins, 0), axis=0)
        remaining -= tl.sum(tl.where(bins == digit, at_least - hist, 0), axis=0)  # those above `digit`
        prefix |= digit.to(tl.uint32) << shift
    # prefix is now the k-th largest key; take every larger key and the first `remaining` equal ones
    taken = tl.zeros((), tl.int32)
    equal_seen = tl.zeros((), tl.int32)
    out_row = out_ptr + t.to(tl.int64) * k
    for c0 in range(0, capacity, BLOCK):
        i = c0 + tl.arange(0, BLOCK)
        s = tl.load(row + i, mask=i < capacity, other=-float("inf"))
        ok = s > -float("inf")
        if HAS_ALLOWED:
            ok &= tl.load(allowed_ptr + t.to(tl.int64) * capacity + i, mask=i < capacity, other=0) != 0
        key = _order_key(s)
        equal = ok & (key == prefix)
        first_equal = tl.cumsum(equal.to(tl.int32), axis=0) + equal_seen <= remaining
        take = (ok & (key > prefix)) | (equal & first_equal)
        pos = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(out_row + pos, i.to(tl.int64), mask=take)
        taken += tl.sum(take.to(tl.int32), axis=0)
        equal_seen += tl.sum(equal.to(tl.int32), axis=0)
    for c0 in range(0, k, BLOCK_K):
        i = c0 + tl.arange(0, BLOCK_K)
        tl.store(out_row + i, tl.full((BLOCK_K,), -1, tl.int64), mask=(i >= taken) & (i < k))


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    pool: torch.Tensor,
    codec: Codec,
    block_tables: torch.Tensor,
    row_seg: torch.Tensor,
    visible: torch.Tensor,
    capacity: int,
    k: int,
    *,
    allowed: torch.Tensor | None = None,
    candidates: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's top-k visible (and allowed) compressed entries of its own sequence, from the paged
    pool: scores as `indexer_logits` into a [T, capacity] float32 buffer, then a radix select per row.
    Same contract as the reference op, except the order of the -1 padding: ids ascending, then -1s.
    The candidate-block mask (candidate sources) is computed from the scores by the reference's torch code.
    """
    t, heads, d = q.shape
    top = torch.empty(t, k, dtype=torch.long, device=q.device)
    scores = torch.empty(t, capacity, dtype=torch.float32, device=q.device)
    if t and capacity:
        region = cache_region(pool, codec.format, codec.dtype)
        q = q if q.stride(-1) == 1 else q.contiguous()
        weights = weights.to(q.dtype).contiguous()
        block_n = 64
        _paged_scores_kernel[(t, triton.cdiv(capacity, block_n))](
            q, weights, region.data, region.stride0, region.stride1, region.data.shape[1],
            block_tables, block_tables.stride(0), row_seg, visible, scores, heads, d, capacity,
            q.stride(0), q.stride(1), weights.stride(0),
            FMT=region.fmt, BLOCK_H=max(16, triton.next_power_of_2(heads)), BLOCK_N=block_n,
            BLOCK_D=max(16, triton.next_power_of_2(d)),
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4,
        )
    mask = None if candidates is None else candidate_blocks(scores, visible, *candidates)
    if t and k:
        _topk_kernel[(t,)](
            scores, scores if allowed is None else allowed.contiguous(), top, capacity, k,
            HAS_ALLOWED=allowed is not None, BLOCK=1024, BLOCK_K=min(1024, triton.next_power_of_2(k)),
            num_warps=8,
        )
    return top, mask
