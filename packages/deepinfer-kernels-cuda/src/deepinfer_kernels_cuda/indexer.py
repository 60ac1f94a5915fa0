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
def _all_blocks_mask(scores, visible, CAND: tl.constexpr, BLOCK_N: tl.constexpr):
    """`candidate_blocks` of this program's scores [BLOCK_N] (whole blocks of CAND entries) when every block
    of the row is among the best: a block is kept if it is the latest visible one or its max-pool is
    > -inf (a NaN max-pools to NaN: dropped); an entry if its block is kept and its score is finite."""
    live = tl.reshape((scores > -float("inf")).to(tl.int32), (BLOCK_N // CAND, CAND))
    nan = tl.reshape((scores != scores).to(tl.int32), (BLOCK_N // CAND, CAND))
    pooled = (tl.max(live, axis=1) > 0) & (tl.max(nan, axis=1) == 0)
    latest = tl.where(visible > 0, (visible - 1) // CAND, -1)
    b = (tl.program_id(1) * BLOCK_N) // CAND + tl.arange(0, BLOCK_N // CAND)
    keep = tl.reshape(tl.broadcast_to(((b == latest) | pooled)[:, None], (BLOCK_N // CAND, CAND)), (BLOCK_N,))
    return keep & (scores > -float("inf")) & (scores < float("inf"))


@triton.jit
def _all_blocks_mask_rows(scores, visible, n, CAND: tl.constexpr, BLOCK_T: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """`_all_blocks_mask` of BLOCK_T rows at once: scores [BLOCK_T, BLOCK_N] of entries n (a whole number
    of blocks from n[0] on), visible [BLOCK_T]."""
    nb: tl.constexpr = BLOCK_N // CAND
    live = tl.reshape((scores > -float("inf")).to(tl.int32), (BLOCK_T, nb, CAND))
    nan = tl.reshape((scores != scores).to(tl.int32), (BLOCK_T, nb, CAND))
    pooled = (tl.max(live, axis=2) > 0) & (tl.max(nan, axis=2) == 0)  # [BLOCK_T, nb]
    latest = tl.where(visible > 0, (visible - 1) // CAND, -1)
    b = tl.min(n, axis=0) // CAND + tl.arange(0, nb)
    kept = (b[None, :] == latest[:, None]) | pooled
    keep = tl.reshape(tl.broadcast_to(kept[:, :, None], (BLOCK_T, nb, CAND)), (BLOCK_T, BLOCK_N))
    return keep & (scores > -float("inf")) & (scores < float("inf"))


@triton.jit(do_not_specialize=["bt_stride"])  # table widths: no new kernel per width
def _paged_scores_kernel(
    q_ptr, w_ptr, pool_ptr, pool_s0, pool_s1, per_block, bt_ptr, bt_stride, seg_ptr, visible_ptr, out_ptr,
    mask_ptr, hist_ptr, T, heads, D, capacity, q_stride_t, q_stride_h, w_stride_t,
    FMT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, CAND: tl.constexpr, ZERO_HIST: tl.constexpr,
):
    """Scores of one row against BLOCK_N entries of its sequence's keys (paged, decoded in registers);
    -inf past the row's visible count. CAND > 0: also the candidate mask of blocks of CAND entries when
    every block is kept (`_all_blocks_mask`). ZERO_HIST: the row's first program zeroes its digit counts
    hist [4, T, 256] of the select that follows (`topk_select`'s `hist`)."""
    t = tl.program_id(0)
    if ZERO_HIST:
        bins = tl.arange(0, 256)
        first = bins < tl.where(tl.program_id(1) == 0, 256, 0)  # only the row's first program stores
        for p in tl.static_range(4):
            tl.store(hist_ptr + (p * T + t) * 256 + bins, tl.zeros((256,), tl.int32), mask=first)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    seq = tl.load(seg_ptr + t).to(tl.int64)
    visible = tl.load(visible_ptr + t)
    valid = n < visible
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
    if CAND > 0:
        keep = _all_blocks_mask(scores, visible, CAND, BLOCK_N)
        tl.store(mask_ptr + t.to(tl.int64) * capacity + n, keep, mask=n < capacity)


@triton.jit
def _tile_scores(q, w, pool_ptr, pool_s0, pool_s1, per_block, bt_ptr, bt_stride, seq, n, top, D,
                 FMT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """Scores [BLOCK_T, BLOCK_N] of a row tile's queries q [BLOCK_T * BLOCK_H, BLOCK_D] (head weights w)
    against entries n of sequence `seq` (entries >= top are not loaded)."""
    valid = n < top
    j = tl.where(valid, n, 0)
    block = tl.load(bt_ptr + seq * bt_stride + j // per_block, mask=valid, other=0).to(tl.int64)
    ty = q.dtype
    k = decode_rows(pool_ptr, block * pool_s0 + (j % per_block) * pool_s1, valid, 0, D, FMT, BLOCK_D, ty)
    dots = tl.maximum(tl.dot(q, tl.trans(k), input_precision=PRECISION).to(ty).to(tl.float32), 0.0)
    terms = (dots * w[:, None]).to(ty).to(tl.float32)
    return tl.sum(tl.reshape(terms, (BLOCK_T, BLOCK_H, BLOCK_N)), axis=1)


@triton.jit(do_not_specialize=["bt_stride", "T"])  # table widths, row counts: no new kernel per value
def _paged_scores_tile_kernel(
    q_ptr, w_ptr, pool_ptr, pool_s0, pool_s1, per_block, bt_ptr, bt_stride, seg_ptr, visible_ptr, out_ptr,
    mask_ptr, hist_ptr, T, heads, D, capacity, q_stride_t, q_stride_h, w_stride_t,
    FMT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, CAND: tl.constexpr, ZERO_HIST: tl.constexpr,
    TILES: tl.constexpr,
):
    """`_paged_scores_kernel` for BLOCK_T rows and TILES entry blocks per program (many rows: a prefill):
    the tile's queries are loaded once, and each key tile is decoded once for the tile's rows of one
    sequence and multiplied with all their heads in one product ([BLOCK_T * BLOCK_H] query rows). Key
    tiles past every row's visible count (the causal half of a prefill) are not loaded: -inf is stored.
    Rows of several sequences in one tile take one pass per sequence."""
    tt = tl.arange(0, BLOCK_T)
    t = tl.program_id(0) * BLOCK_T + tt
    live = t < T
    chunk = tl.program_id(1) * (TILES * BLOCK_N)
    if ZERO_HIST:
        bins = tl.arange(0, 256)
        first = bins < tl.where(tl.program_id(1) == 0, 256, 0)  # only the rows' first programs store
        for p in tl.static_range(4):
            tl.store(hist_ptr + ((p * T + t) * 256)[:, None] + bins[None, :],
                     tl.zeros((BLOCK_T, 256), tl.int32), mask=live[:, None] & first[None, :])
    d = tl.arange(0, BLOCK_D)
    r = tl.arange(0, BLOCK_T * BLOCK_H)
    rt = tl.program_id(0) * BLOCK_T + r // BLOCK_H
    h = r % BLOCK_H
    q = tl.load(q_ptr + rt[:, None].to(tl.int64) * q_stride_t + h[:, None] * q_stride_h + d[None, :],
                mask=((rt < T) & (h < heads))[:, None] & (d < D)[None, :], other=0.0)
    w = tl.load(w_ptr + rt.to(tl.int64) * w_stride_t + h, mask=(rt < T) & (h < heads), other=0.0)
    w = w.to(tl.float32)
    seqs = tl.load(seg_ptr + t, mask=live, other=-1)
    visible = tl.load(visible_ptr + t, mask=live, other=0)
    nn = tl.arange(0, BLOCK_N)
    rows = t[:, None].to(tl.int64) * capacity
    todo = live
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        lead = tl.min(tl.where(todo, tt, BLOCK_T), axis=0)
        seq = tl.sum(tl.where(tt == lead, seqs, 0), axis=0)
        mine = todo & (seqs == seq)
        top = tl.max(tl.where(mine, visible, 0), axis=0)
        # entry blocks with a visible entry, then the rest (-inf, and not kept)
        live_tiles = tl.minimum(tl.maximum(tl.cdiv(top - chunk, BLOCK_N), 0), TILES)
        for i in range(live_tiles):
            n = chunk + i * BLOCK_N + nn
            scores = _tile_scores(q, w, pool_ptr, pool_s0, pool_s1, per_block, bt_ptr, bt_stride,
                                  seq.to(tl.int64), n, top, D, FMT, BLOCK_T, BLOCK_H, BLOCK_N, BLOCK_D,
                                  PRECISION)
            scores = tl.where(n[None, :] < visible[:, None], scores, -float("inf"))
            stored = mine[:, None] & (n < capacity)[None, :]
            tl.store(out_ptr + rows + n[None, :], scores, mask=stored)
            if CAND > 0:
                keep = _all_blocks_mask_rows(scores, visible, n, CAND, BLOCK_T, BLOCK_N)
                tl.store(mask_ptr + rows + n[None, :], keep, mask=stored)
        for i in range(live_tiles, TILES):
            n = chunk + i * BLOCK_N + nn
            stored = mine[:, None] & (n < capacity)[None, :]
            tl.store(out_ptr + rows + n[None, :], tl.full((BLOCK_T, BLOCK_N), -float("inf"), tl.float32),
                     mask=stored)
            if CAND > 0:
                tl.store(mask_ptr + rows + n[None, :], tl.zeros((BLOCK_T, BLOCK_N), tl.int1), mask=stored)
        todo = todo & (seqs != seq)


@triton.jit
def _order_key(s):
    """float32 -> uint32 whose unsigned order is the float order (larger score, larger key)."""
    bits = s.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)


# The select reads rows in steps of _BLOCK entries; for few rows it splits each row into chunks of whole
# steps so that about _TARGET_PROGRAMS programs (2 per SM of an H200) share the work.
_BLOCK = 1024
_TARGET_PROGRAMS = 264
_SELECT_WARPS = 8  # warps of the one-program-per-row select ...
# ... and up to this many entries a row: 2 warps (H200, the prefill's rows of 1024 / 2048 entries, session 10:
# 46 / 109 us against 75 / 164 us with 8 warps; the same ids: the select is exact). Longer rows keep 8 (not
# measured with fewer)
_SELECT_SHORT, _SELECT_SHORT_WARPS = 2048, 2


@triton.jit
def _row_keys(row, allowed_row, i, stop, HAS_ALLOWED: tl.constexpr):
    """Order keys of entries i of a row, and whether each takes part (finite score, allowed, i < stop)."""
    s = tl.load(row + i, mask=i < stop, other=-float("inf"))
    ok = s > -float("inf")
    if HAS_ALLOWED:
        ok &= tl.load(allowed_row + i, mask=i < stop, other=0) != 0
    return _order_key(s), ok


@triton.jit
def _digit_histogram(
    row, allowed_row, start, stop, prefix, SHIFT: tl.constexpr, HAS_ALLOWED: tl.constexpr, BLOCK: tl.constexpr
):
    """Counts [512] of the digit (key >> SHIFT) & 0xFF over entries [start, stop) that take part and
    whose higher digits equal `prefix`'s; bins 256.. are zero."""
    hist = tl.zeros((512,), tl.int32)
    for c0 in range(start, stop, BLOCK):
        key, ok = _row_keys(row, allowed_row, c0 + tl.arange(0, BLOCK), stop, HAS_ALLOWED)
        if SHIFT < 24:
            ok &= (key >> (SHIFT + 8)) == (prefix >> (SHIFT + 8))
        hist += tl.histogram(tl.where(ok, (key >> SHIFT) & 0xFF, 256).to(tl.int32), 512)  # 256: outside
    return tl.where(tl.arange(0, 512) < 256, hist, 0)


@triton.jit
def _next_digit(hist, remaining, k, FIRST: tl.constexpr):
    """One radix step: from a row's digit counts [512] (bins 256.. zero) of the keys matching the prefix,
    the digit of the k-th largest key and how many keys equal to the prefix so far are still to take."""
    bins = tl.arange(0, 512)
    total = tl.sum(hist, axis=0)
    if FIRST:
        remaining = tl.minimum(k, total)
    at_least = total - tl.cumsum(hist, axis=0) + hist  # keys with digit >= bin
    digit = tl.max(tl.where((bins < 256) & (at_least >= remaining), bins, 0), axis=0)
    remaining -= tl.sum(tl.where(bins == digit, at_least - hist, 0), axis=0)  # those above `digit`
    return digit, remaining


@triton.jit
def _write_ids(
    row, allowed_row, out_row, start, stop, prefix, remaining, taken, equal_seen,
    HAS_ALLOWED: tl.constexpr, BLOCK: tl.constexpr,
):
    """Writes the ids in [start, stop) of every key > prefix and of the equal keys while fewer than
    `remaining` equal ones came before (`equal_seen` before `start`), from output slot `taken` on,
    ascending; returns the slots used so far."""
    for c0 in range(start, stop, BLOCK):
        i = c0 + tl.arange(0, BLOCK)
        key, ok = _row_keys(row, allowed_row, i, stop, HAS_ALLOWED)
        equal = ok & (key == prefix)
        first_equal = tl.cumsum(equal.to(tl.int32), axis=0) + equal_seen <= remaining
        take = (ok & (key > prefix)) | (equal & first_equal)
        pos = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(out_row + pos, i.to(tl.int64), mask=take)
        taken += tl.sum(take.to(tl.int32), axis=0)
        equal_seen += tl.sum(equal.to(tl.int32), axis=0)
    return taken


@triton.jit
def _pad(out_row, taken, k, BLOCK_K: tl.constexpr):
    """-1 in output slots [taken, k)."""
    for c0 in range(0, k, BLOCK_K):
        i = c0 + tl.arange(0, BLOCK_K)
        tl.store(out_row + i, tl.full((BLOCK_K,), -1, tl.int64), mask=(i >= taken) & (i < k))


@triton.jit
def _topk_kernel(
    scores_ptr, allowed_ptr, out_ptr, capacity, k,
    HAS_ALLOWED: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Per row: the k largest finite (and allowed) scores by an exact 4-pass radix select on 8-bit
    digits of the order key, ties broken by the lowest entry id; ids ascending, then -1 padding."""
    t = tl.program_id(0).to(tl.int64)
    row, allowed_row = scores_ptr + t * capacity, allowed_ptr + t * capacity
    hist = _digit_histogram(row, allowed_row, 0, capacity, tl.zeros((), tl.uint32), 24, HAS_ALLOWED, BLOCK)
    if tl.sum(hist, axis=0) <= k:
        # at most k entries take part (the early rows of a causal prefill): all of them; every key of a
        # finite score is > 0
        prefix = tl.zeros((), tl.uint32)
        remaining = tl.zeros((), tl.int32)
    else:
        digit, remaining = _next_digit(hist, tl.zeros((), tl.int32), k, True)
        prefix = digit.to(tl.uint32) << 24
        for p in tl.static_range(1, 4):
            hist = _digit_histogram(row, allowed_row, 0, capacity, prefix, 24 - 8 * p, HAS_ALLOWED, BLOCK)
            digit, remaining = _next_digit(hist, remaining, k, False)
            prefix |= digit.to(tl.uint32) << (24 - 8 * p)
    # prefix is now the k-th largest key; take every larger key and the first `remaining` equal ones
    out_row = out_ptr + t * k
    taken = _write_ids(row, allowed_row, out_row, 0, capacity, prefix, remaining, tl.zeros((), tl.int32),
                       tl.zeros((), tl.int32), HAS_ALLOWED, BLOCK)
    _pad(out_row, taken, k, BLOCK_K)


@triton.jit
def _chunk_prefix(hist_ptr, t, T, k, PASSES: tl.constexpr):
    """(prefix, remaining) of row t after PASSES radix steps, from the rows' summed digit counts
    hist [4, T, 256]; every program of the row derives the same values."""
    bins = tl.arange(0, 512)
    prefix = tl.zeros((), tl.uint32)
    remaining = tl.zeros((), tl.int32)
    for p in tl.static_range(PASSES):
        hist = tl.load(hist_ptr + (p * T + t) * 256 + bins, mask=bins < 256, other=0)
        digit, remaining = _next_digit(hist, remaining, k, p == 0)
        prefix |= digit.to(tl.uint32) << (24 - 8 * p)
    return prefix, remaining


@triton.jit
def _chunk_histogram_kernel(
    scores_ptr, allowed_ptr, hist_ptr, chunk_hist_ptr, T, capacity, k, chunk, chunks,
    PASS: tl.constexpr, HAS_ALLOWED: tl.constexpr, BLOCK: tl.constexpr,
):
    """Radix step PASS, program (row, chunk): the chunk's digit counts added into hist[PASS, row] and
    stored as chunk_hist[PASS, row, chunk]."""
    t, c = tl.program_id(0), tl.program_id(1)
    row, allowed_row = scores_ptr + t.to(tl.int64) * capacity, allowed_ptr + t.to(tl.int64) * capacity
    prefix, _ = _chunk_prefix(hist_ptr, t, T, k, PASS)
    stop = tl.minimum(c * chunk + chunk, capacity)
    hist = _digit_histogram(row, allowed_row, c * chunk, stop, prefix, 24 - 8 * PASS, HAS_ALLOWED, BLOCK)
    bins = tl.arange(0, 512)
    tl.atomic_add(hist_ptr + (PASS * T + t) * 256 + bins, hist, mask=(bins < 256) & (hist != 0),
                  sem="relaxed")
    tl.store(chunk_hist_ptr + ((PASS * T + t) * chunks + c).to(tl.int64) * 256 + bins, hist, mask=bins < 256)


@triton.jit
def _chunks_before(chunk_hist_ptr, t, T, chunks, prefix, c_stop):
    """How many keys of chunks [0, c_stop) of row t are > and == the k-th largest key `prefix`, from
    every pass's per-chunk digit counts: a key is greater where its first differing digit is."""
    bins = tl.arange(0, 256)
    greater = tl.zeros((), tl.int32)
    equal = tl.zeros((), tl.int32)
    for c0 in range(0, c_stop, 16):
        cs = c0 + tl.arange(0, 16)
        for p in tl.static_range(4):
            digit = ((prefix >> (24 - 8 * p)) & 0xFF).to(tl.int32)
            at = chunk_hist_ptr + ((p * T + t) * chunks + cs[:, None]).to(tl.int64) * 256 + bins[None, :]
            h = tl.load(at, mask=(cs < c_stop)[:, None], other=0)
            greater += tl.sum(tl.sum(tl.where(bins[None, :] > digit, h, 0), axis=1), axis=0)
            if p == 3:
                equal += tl.sum(tl.sum(tl.where(bins[None, :] == digit, h, 0), axis=1), axis=0)
    return greater, equal


@triton.jit
def _chunk_write_kernel(
    scores_ptr, allowed_ptr, hist_ptr, chunk_hist_ptr, out_ptr, T, capacity, k, chunk, chunks,
    HAS_ALLOWED: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (row, chunk): the chunk's selected ids at the slots after those of the chunks before it
    (counted here from their digit counts); the row's last chunk writes the -1 padding."""
    t, c = tl.program_id(0), tl.program_id(1)
    row, allowed_row = scores_ptr + t.to(tl.int64) * capacity, allowed_ptr + t.to(tl.int64) * capacity
    prefix, remaining = _chunk_prefix(hist_ptr, t, T, k, 4)
    greater_before, equal_before = _chunks_before(chunk_hist_ptr, t, T, chunks, prefix, c)
    taken = greater_before + tl.minimum(equal_before, remaining)
    out_row = out_ptr + t.to(tl.int64) * k
    stop = tl.minimum(c * chunk + chunk, capacity)
    _write_ids(row, allowed_row, out_row, c * chunk, stop, prefix, remaining, taken, equal_before,
               HAS_ALLOWED, BLOCK)
    if c == chunks - 1:
        greater, equal = _chunks_before(chunk_hist_ptr, t, T, chunks, prefix, chunks)
        _pad(out_row, greater + tl.minimum(equal, remaining), k, BLOCK_K)


TILE_ROWS = 128  # rows from which the scores may take row tiles (below: decode and verification steps)
# query rows (heads of the tile's rows) per product: 8 rows of 32 heads. H200, a 2048-token prefill's scores
# (benchmarks/kernels/indexer.py --prefill, session 10), 4 key tiles, 8 warps, cap 128: 141 us (ratio 2,
# capacity 1024) and 245 us (ratio 1, 2048) against 182 / 341 us with 128 rows, the same scores bitwise
_TILE_MMA_ROWS = 256


def tile_rows(rows: int, seqs: int, heads: int, batch_invariant: bool) -> int:
    """Query rows per program of the scores kernel: 1, or for TILE_ROWS rows or more of at least a
    tile's rows per sequence on average (a tile of rows of several sequences takes a pass each: not for
    decode batches) and not `batch_invariant`, as many as fill a _TILE_MMA_ROWS-row product with their
    heads."""
    tile = max(1, _TILE_MMA_ROWS // max(16, triton.next_power_of_2(heads)))
    if batch_invariant or rows < TILE_ROWS or rows < tile * seqs:
        return 1
    return tile


def select_chunk(rows: int, capacity: int) -> int:
    """Entries per program of the top-k select: whole rows (one program per row) once `rows` fill the
    GPU, else chunks of whole _BLOCK steps so that rows * chunks is about _TARGET_PROGRAMS."""
    chunks = min(triton.cdiv(_TARGET_PROGRAMS, max(rows, 1)), triton.cdiv(capacity, _BLOCK))
    return capacity if chunks <= 1 else triton.cdiv(triton.cdiv(capacity, chunks), _BLOCK) * _BLOCK


def topk_select(
    scores: torch.Tensor, k: int, allowed: torch.Tensor | None = None, *, chunk: int | None = None,
    hist: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per row of scores [T, capacity] float32: the ids of the k largest finite (and `allowed`) scores,
    ascending, then -1 padding -> [T, k] long. Ties at the k-th score go to the lowest ids; scores are
    ordered by their bits (-0.0 below +0.0). Exact radix select (4 passes over 8-bit digits).

    `chunk` = entries per program (default `select_chunk`): at chunk >= capacity one program per row
    runs the whole select; smaller chunks (a multiple of 1024, or a power of two below it) split each
    row over several programs in 5 launches (4 digit passes: row counts by atomics, and each chunk's
    counts; then ids, each chunk placed after the keys the chunks before it take).
    Both paths compute the same digits, so the output is identical: the path, chosen from T and the
    capacity only, does not change a row's result (batch invariant). No host syncs (graph-capturable).
    `hist`: zeroed int32 [4, T, 256] digit counts for the several-programs path (None: zeroed here).
    """
    rows, capacity = scores.shape
    if scores.dtype != torch.float32 or not scores.is_contiguous():
        raise ValueError(f"topk_select needs contiguous float32 scores, got {scores.dtype}")
    if allowed is not None and allowed.shape != scores.shape:
        raise ValueError(f"topk_select: allowed {tuple(allowed.shape)} does not match scores "
                         f"{tuple(scores.shape)}")
    top = torch.empty(rows, k, dtype=torch.long, device=scores.device)
    if not rows or not k:
        return top
    chunk = select_chunk(rows, capacity) if chunk is None else chunk
    allowed_arg = scores if allowed is None else allowed.contiguous()
    block_k = min(1024, triton.next_power_of_2(k))
    if chunk >= capacity:
        warps = _SELECT_SHORT_WARPS if capacity <= _SELECT_SHORT else _SELECT_WARPS
        _topk_kernel[(rows,)](scores, allowed_arg, top, capacity, k, HAS_ALLOWED=allowed is not None,
                              BLOCK=_BLOCK, BLOCK_K=block_k, num_warps=warps)
        return top
    block = min(_BLOCK, chunk)
    if chunk < 1 or block & (block - 1) or chunk % block:
        raise ValueError(f"topk_select: chunk {chunk} is no multiple of {_BLOCK} nor a power of two below it")
    chunks = triton.cdiv(capacity, chunk)
    if hist is None:
        hist = torch.zeros(4, rows, 256, dtype=torch.int32, device=scores.device)
    elif hist.shape != (4, rows, 256) or hist.dtype != torch.int32:
        raise ValueError(f"topk_select: hist must be int32 [4, {rows}, 256], got {hist.dtype} "
                         f"{tuple(hist.shape)}")
    chunk_hist = torch.empty(4, rows, chunks, 256, dtype=torch.int32, device=scores.device)
    common = {"HAS_ALLOWED": allowed is not None, "BLOCK": block, "num_warps": 4}
    sizes = (rows, capacity, k, chunk, chunks)
    for p in range(4):
        _chunk_histogram_kernel[(rows, chunks)](scores, allowed_arg, hist, chunk_hist, *sizes, PASS=p,
                                                **common)
    _chunk_write_kernel[(rows, chunks)](scores, allowed_arg, hist, chunk_hist, top, *sizes, BLOCK_K=block_k,
                                        **common)
    return top


_SCORE_ENTRIES = 64  # entries per key tile of the scores kernels
_TILE_BLOCKS = 4  # key tiles per program of the row tiles (the queries' load shared by them)
_TILE_WARPS = 8  # the row tiles' warps: the tile's query rows, keys and products in half the registers
# ... and their register cap: ptxas (sm_90a) takes 141 a thread for the pipelined key-tile loop (one
# program per SM), 116 under this cap without spilling (two per SM)
_TILE_MAXNREG = 128


def paged_scores(
    q: torch.Tensor, weights: torch.Tensor, pool: torch.Tensor, codec: Codec, block_tables: torch.Tensor,
    row_seg: torch.Tensor, visible: torch.Tensor, scores: torch.Tensor, *, mask: torch.Tensor | None = None,
    cand: int = 0, hist: torch.Tensor | None = None, block_t: int = 1,
) -> None:
    """Scores [T, capacity] (float32, -inf past each row's visible count) of q [T, heads, D] against
    its sequence's paged keys, written into `scores`; `cand` > 0: also the all-blocks-kept candidate mask
    of blocks of `cand` entries into `mask`; `hist`: zeroes the [4, T, 256] digit counts of the select.
    `block_t` rows per program (1: `_paged_scores_kernel`, else the row tiles)."""
    t, heads, d = q.shape
    capacity = scores.shape[1]
    if not t or not capacity:
        return
    region = cache_region(pool, codec.format, codec.dtype)
    q = q if q.stride(-1) == 1 else q.contiguous()
    weights = weights.to(q.dtype).contiguous()
    args = (q, weights, region.data, region.stride0, region.stride1, region.data.shape[1], block_tables,
            block_tables.stride(0), row_seg, visible, scores, scores if mask is None else mask,
            scores if hist is None else hist, t, heads, d, capacity, q.stride(0), q.stride(1),
            weights.stride(0))
    config = {"FMT": region.fmt, "BLOCK_H": max(16, triton.next_power_of_2(heads)),
              "BLOCK_N": _SCORE_ENTRIES, "BLOCK_D": max(16, triton.next_power_of_2(d)),
              "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32", "CAND": cand,
              "ZERO_HIST": hist is not None, "num_warps": 4}
    if block_t > 1:
        config["num_warps"], config["maxnreg"] = _TILE_WARPS, _TILE_MAXNREG or None
        grid = (triton.cdiv(t, block_t), triton.cdiv(capacity, _TILE_BLOCKS * _SCORE_ENTRIES))
        _paged_scores_tile_kernel[grid](*args, BLOCK_T=block_t, TILES=_TILE_BLOCKS, **config)
    else:
        _paged_scores_kernel[(t, triton.cdiv(capacity, _SCORE_ENTRIES))](*args, **config)


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
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's top-k visible (and allowed) compressed entries of its own sequence, from the paged
    pool: scores as `indexer_logits` into a [T, capacity] float32 buffer, then `topk_select` (one
    program per row, or several per row when few rows: the same result either way). For TILE_ROWS
    rows or more of several rows per sequence (a prefill), unless `batch_invariant`, the scores take
    tiles of several rows per program (`tile_rows`: another tensor-core product shape, so a row's scores
    may differ in rounding).
    Same contract as the reference op, except the order of the -1 padding: ids ascending, then -1s.
    The candidate-block mask (candidate sources) is computed from the scores by the reference's torch code,
    or, when every block is kept, by the scores kernel.
    """
    t, heads = q.shape[:2]
    scores = torch.empty(t, capacity, dtype=torch.float32, device=q.device)
    # every candidate block kept (the row width holds at most topk_blocks): the scores kernel writes the mask
    in_kernel = candidates is not None and triton.cdiv(capacity, candidates[1]) <= candidates[0] \
        and _SCORE_ENTRIES % candidates[1] == 0
    mask = torch.empty(t, capacity, dtype=torch.bool, device=q.device) if in_kernel else None
    # the select's digit counts (several programs per row) zeroed by the scores kernel: one launch fewer
    chunked = select_chunk(t, capacity) < capacity and t > 0 and capacity > 0
    hist = torch.empty(4, t, 256, dtype=torch.int32, device=q.device) if chunked else None
    paged_scores(q, weights, pool, codec, block_tables, row_seg, visible, scores, mask=mask,
                 cand=candidates[1] if in_kernel else 0, hist=hist,
                 block_t=tile_rows(t, block_tables.shape[0], heads, batch_invariant))
    if candidates is not None and not in_kernel:
        mask = candidate_blocks(scores, visible, *candidates)
    top = topk_select(scores, k, allowed, hist=hist)
    return top, mask
