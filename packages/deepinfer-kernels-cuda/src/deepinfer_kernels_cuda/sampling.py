"""Sampling kernels: the sampling ops of deepinfer.ops.reference.sampling without a sort and without the host.

Every kernel is row-wise: a row's result depends on that row's logits and settings alone. A row is cut
into `_splits(V)` fixed slices (a function of the vocabulary size only, never of the batch), and each
cross-slice reduction runs in a fixed order, so the ops are batch-invariant by construction and need
no `batch_invariant` switch.

`sample_tokens` (oracle: reference `sample_tokens`, `filter_mask`, `draw`) in launches over (row, slice):
  1. max and first argmax of the raw logits (greedy rows stop here);
  2. e = exp(x / t - max) (the softmax numerator, stored) and its sum S;
  3. filtered rows: a 4-bit radix search (8 levels over the float32 bits of e, which order like e)
     for the last token the filters keep in the reference's order (e descending, index ascending):
     per level a 16-bin histogram of counts and masses of the candidates (e > 0 and e >= min_p, which
     is p >= min_p * p_max since e_max = 1) under the prefix found so far; the kept bin is the lowest
     whose first token has rank < top_k and mass before it < top_p * S;
  4. kept mass per slice in float64; 5. the inverse-CDF draw with the counter-based uniform of
     deepinfer.sampling.rng (reimplemented here on uint64 bits): the first kept token whose float64
     CDF (index order) exceeds u * total.

Guarantees against the reference on the same logits and seeds (CUDA; see tests/test_sampling_cuda.py):
  * greedy rows: identical (first index of the maximum; logits without NaN);
  * uniforms: bit-identical to `rng.uniform`;
  * e is computed with the reference's roundings (correctly rounded x / t, libdevice's expf as torch's
    exp; values below 2^-126 flush to zero); probabilities differ from the reference's only by the
    normalisation S (summed in another order) and our use of e instead of e / S: a few float32 ulps;
  * the kept set (top-k, top-p, min-p) is the reference's except where the reference's float32 order
    has ties that e does not have, or a top-p / min-p comparison lies within float32 rounding of the
    cut (cumulative mass within ~1e-6 of top_p, or p within an ulp of min_p * p_max);
  * the drawn token is the reference's except where u * total lies within the float32 rounding of the
    probabilities of a CDF step; it is always a kept token of positive probability (the reference
    clamps to the last index when u * total rounds up to the total; we take the last kept token).
    Measured (H200, V=129280, mixed temperature / top-k / top-p / min-p rows): 0 of 5120 drawn tokens
    differ from the reference's; greedy, penalties, bitmask and uniforms bitwise.
Inputs: float32 logits [B, V] with at least one finite logit per row and no NaN or +inf.

`apply_penalties`: the reference's stages as scatters over the (row, token) pairs (no dense passes
besides the copy); bitwise equal when a row's logit-bias ids are distinct (as the sampler builds them).
`apply_token_bitmask`: one elementwise pass, bitwise equal. `compute_logprobs` stays on the reference: a
kernel version (per-slice max and exp-sum, topk of the raw logits) ran at 0.6x / 0.44x of its speed at
batch 1 / 64 on the H200 (eager), so it was dropped.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from deepinfer.ops.sampling import SamplingMetadata
from deepinfer.sampling import rng

# Triton's interpreter has no libdevice: exp and the exact mul-add use numpy there (already IEEE).
_DEVICE = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")

_BLOCK = 1024  # tokens per loop step of a slice program
_SLICE = 4 * _BLOCK  # target tokens per slice
_MAX_SLICES = 64
_BINS = 16  # radix digit: 4 bits, 8 levels over the 32 bits of a float32
_LEVELS = 8
_MASK64 = (1 << 64) - 1


@triton.jit
def _exp(x):
    if _DEVICE:
        y = libdevice.exp(x)  # correctly rounded to within an ulp, as torch's expf (tl.exp is ex2.approx)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _mul_add(a, b, c):
    """a * b + c with two roundings, as torch computes it in separate kernels (no FMA contraction)."""
    if _DEVICE:
        y = libdevice.add_rn(libdevice.mul_rn(a, b), c)
    else:
        y = a * b + c
    return y


@triton.jit
def _splitmix(z):
    """SplitMix64 finalizer on uint64 (rng._finalize)."""
    z = z + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _uniform(seed, position, PURPOSE_KEY: tl.constexpr):
    """rng.uniform of int64 `seed` and `position`: float64 in [0, 1). PURPOSE_KEY: purpose * mul mod 2^64."""
    s = seed.to(tl.uint64, bitcast=True)
    p = position.to(tl.uint64, bitcast=True)
    key = _splitmix(s ^ (p * 0xD6E8FEB86659FD93) ^ PURPOSE_KEY)
    key = _splitmix(key)
    return (key >> 11).to(tl.float64) * (1.0 / 9007199254740992.0)


@triton.jit
def _uniform_kernel(seed_ptr, pos_ptr, out_ptr, n, PURPOSE_KEY: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    u = _uniform(tl.load(seed_ptr + i, mask=m, other=0), tl.load(pos_ptr + i, mask=m, other=0), PURPOSE_KEY)
    tl.store(out_ptr + i, u, mask=m)


def uniform(seeds: torch.Tensor, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """The kernels' counter-based uniforms, as rng.uniform([B] int64, [B] int64, purpose) -> [B] float64."""
    out = torch.empty(seeds.shape, dtype=torch.float64, device=seeds.device)
    n = seeds.numel()
    if n:
        _uniform_kernel[(triton.cdiv(n, 256),)](seeds.contiguous(), positions.contiguous(), out, n,
                                                 PURPOSE_KEY=_purpose_key(purpose), BLOCK=256)
    return out


def _purpose_key(purpose: int) -> int:
    return (purpose * (rng._PURPOSE_MUL & _MASK64)) & _MASK64


def _splits(vocab: int) -> tuple[int, int]:
    """(slices per row, tokens per slice, a multiple of _BLOCK): a function of the vocabulary alone."""
    n = max(1, min(_MAX_SLICES, triton.cdiv(vocab, _SLICE)))
    length = triton.cdiv(triton.cdiv(vocab, n), _BLOCK) * _BLOCK
    return triton.cdiv(vocab, length), length


# ---- stage 1 and 2: max / argmax, softmax numerator and its sum -------------------------------------


@triton.jit
def _max_kernel(x_ptr, stride, max_ptr, arg_ptr, V, LENGTH: tl.constexpr, NS: tl.constexpr,
                BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 2147483647, tl.int32)
    for start in range(sl * LENGTH, tl.minimum(sl * LENGTH + LENGTH, V), BLOCK):
        i = start + cols
        x = tl.load(x_ptr + row * stride + i, mask=i < V, other=float("-inf"))
        # strict: each lane keeps the earliest index of its maximum (its first index on all -inf)
        better = (x > best) | (best_i == 2147483647)
        best_i = tl.where(better, i, best_i)
        best = tl.where(better, x, best)
    m = tl.max(best, axis=0)
    first = tl.min(tl.where(best == m, best_i, 2147483647), axis=0)
    tl.store(max_ptr + row * NS + sl, m)
    tl.store(arg_ptr + row * NS + sl, first)


@triton.jit
def _row_max(max_ptr, arg_ptr, row, NS: tl.constexpr, NS_P2: tl.constexpr):
    """(max, first argmax) of a row from its slice partials, slices in index order."""
    s = tl.arange(0, NS_P2)
    ms = tl.load(max_ptr + row * NS + s, mask=s < NS, other=float("-inf"))
    m = tl.max(ms, axis=0)
    first_slice = tl.min(tl.where(ms == m, s, NS_P2), axis=0)
    arg = tl.sum(tl.where(s == first_slice, tl.load(arg_ptr + row * NS + s, mask=s < NS, other=0), 0), axis=0)
    return m, arg


@triton.jit
def _exp_sum_kernel(x_ptr, stride, e_ptr, t_ptr, greedy_ptr, max_ptr, arg_ptr, sum_ptr, V,
                    LENGTH: tl.constexpr, NS: tl.constexpr, NS_P2: tl.constexpr, BLOCK: tl.constexpr):
    """Per slice of a drawn row: e = exp(x / t - max), stored, and its sum."""
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    if tl.load(greedy_ptr + row).to(tl.int32) == 0:
        cols = tl.arange(0, BLOCK)
        m, _ = _row_max(max_ptr, arg_ptr, row, NS, NS_P2)
        t = tl.load(t_ptr + row)
        m = tl.math.div_rn(m, t)  # max(x / t) = max(x) / t: correctly rounded division is monotone
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(sl * LENGTH, tl.minimum(sl * LENGTH + LENGTH, V), BLOCK):
            i = start + cols
            x = tl.load(x_ptr + row * stride + i, mask=i < V, other=float("-inf"))
            e = _exp(tl.math.div_rn(x, tl.zeros([BLOCK], tl.float32) + t) - m)
            acc += e
            tl.store(e_ptr + row * V + i, e, mask=i < V)
        tl.store(sum_ptr + row * NS + sl, tl.sum(acc, axis=0))


@triton.jit
def _row_sum(sum_ptr, row, NS: tl.constexpr, NS_P2: tl.constexpr):
    s = tl.arange(0, NS_P2)
    return tl.sum(tl.load(sum_ptr + row * NS + s, mask=s < NS, other=0.0), axis=0)


# ---- stage 3: radix search for the last kept token ---------------------------------------------------


@triton.jit
def _decide(cnt, mass, prefix, above, mass_above, k, limit, BINS: tl.constexpr):
    """One radix level: the lowest bin whose first (largest) candidate is kept, i.e. has rank < k and
    mass before it < limit, given `above` candidates of mass `mass_above` beyond the current prefix.
    Returns (prefix extended by the bin, the counts and mass beyond it, the bin)."""
    bins = tl.arange(0, BINS)
    higher = bins[None, :] > bins[:, None]
    cnt_gt = tl.sum(tl.where(higher, cnt[None, :], 0), axis=1)
    mass_gt = tl.sum(tl.where(higher, mass[None, :], 0.0), axis=1)
    ok = (cnt > 0) & (above + cnt_gt < k) & (mass_above + mass_gt < limit)
    b = tl.min(tl.where(ok, bins, BINS - 1), axis=0)  # some bin is always ok: the first candidate is kept
    pick = bins == b
    return (prefix * BINS + b, above + tl.sum(tl.where(pick, cnt_gt, 0), axis=0),
            mass_above + tl.sum(tl.where(pick, mass_gt, 0.0), axis=0), b)


@triton.jit
def _level_totals(cnt_ptr, mass_ptr, row, B, NS: tl.constexpr, NS_P2: tl.constexpr, BINS: tl.constexpr):
    """Histogram of one level summed over a row's slices (in slice order)."""
    s = tl.arange(0, NS_P2)[:, None]
    off = (row * NS + s) * BINS + tl.arange(0, BINS)[None, :]
    m = s < NS
    return (tl.sum(tl.load(cnt_ptr + off, mask=m, other=0), axis=0),
            tl.sum(tl.load(mass_ptr + off, mask=m, other=0.0), axis=0))


@triton.jit
def _state(cnt_ptr, mass_ptr, state_ptr, mstate_ptr, row, B, k, limit, LEVEL: tl.constexpr,
           NS: tl.constexpr, NS_P2: tl.constexpr, BINS: tl.constexpr):
    """Search state before level LEVEL: (key prefix, candidates above it, their mass, last bin)."""
    if LEVEL == 0:
        prefix = 0
        above = 0
        mass_above = 0.0
        b = 0
    else:
        prev = LEVEL - 1
        cnt, mass = _level_totals(cnt_ptr + prev * B * NS * BINS, mass_ptr + prev * B * NS * BINS, row, B,
                                  NS, NS_P2, BINS)
        prefix = tl.load(state_ptr + (prev * B + row) * 2)
        above = tl.load(state_ptr + (prev * B + row) * 2 + 1)
        mass_above = tl.load(mstate_ptr + prev * B + row)
        prefix, above, mass_above, b = _decide(cnt, mass, prefix, above, mass_above, k, limit, BINS)
    return prefix, above, mass_above, b


@triton.jit
def _radix_kernel(e_ptr, filt_ptr, k_ptr, p_ptr, minp_ptr, sum_ptr, cnt_ptr, mass_ptr, state_ptr, mstate_ptr,
                  B, V, LEVEL: tl.constexpr, LENGTH: tl.constexpr, NS: tl.constexpr, NS_P2: tl.constexpr,
                  BLOCK: tl.constexpr, BINS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    if tl.load(filt_ptr + row).to(tl.int32) != 0:
        k = tl.load(k_ptr + row)
        limit = tl.load(p_ptr + row) * _row_sum(sum_ptr, row, NS, NS_P2)
        min_p = tl.load(minp_ptr + row)
        prefix, above, mass_above, _ = _state(cnt_ptr, mass_ptr, state_ptr, mstate_ptr, row, B, k, limit,
                                              LEVEL, NS, NS_P2, BINS)
        if sl == 0:
            tl.store(state_ptr + (LEVEL * B + row) * 2, prefix)
            tl.store(state_ptr + (LEVEL * B + row) * 2 + 1, above)
            tl.store(mstate_ptr + LEVEL * B + row, mass_above)
        cols = tl.arange(0, BLOCK)
        bins = tl.arange(0, BINS)
        cnt = tl.zeros([BINS], tl.int32)
        mass = tl.zeros([BINS], tl.float32)
        for start in range(sl * LENGTH, tl.minimum(sl * LENGTH + LENGTH, V), BLOCK):
            i = start + cols
            e = tl.load(e_ptr + row * V + i, mask=i < V, other=0.0)
            key = e.to(tl.int32, bitcast=True)  # e >= 0: the bits order like the values
            cand = (e > 0.0) & (e >= min_p)
            if LEVEL > 0:
                cand = cand & ((key >> (32 - 4 * LEVEL)) == prefix)
            digit = (key >> (28 - 4 * LEVEL)) & (BINS - 1)
            hit = (digit[:, None] == bins[None, :]) & cand[:, None]
            cnt += tl.sum(hit.to(tl.int32), axis=0)
            mass += tl.sum(tl.where(hit, e[:, None], 0.0), axis=0)
        off = ((LEVEL * B + row) * NS + sl) * BINS + bins
        tl.store(cnt_ptr + off, cnt)
        tl.store(mass_ptr + off, mass)


# ---- stages 4 and 5: kept mass, inverse-CDF draw -----------------------------------------------------


@triton.jit
def _cut(cnt_ptr, mass_ptr, state_ptr, mstate_ptr, row, sl, B, k, limit, NS: tl.constexpr,
         NS_P2: tl.constexpr, BINS: tl.constexpr, LEVELS: tl.constexpr):
    """The full key of the last kept token, the candidates above it and their mass, and how many
    tokens equal to it lie in the row's slices before `sl` (ties keep index order)."""
    key, above, mass_above, b = _state(cnt_ptr, mass_ptr, state_ptr, mstate_ptr, row, B, k, limit, LEVELS,
                                       NS, NS_P2, BINS)
    s = tl.arange(0, NS_P2)
    last = cnt_ptr + (LEVELS - 1) * B * NS * BINS
    ties = tl.sum(tl.load(last + (row * NS + s) * BINS + b, mask=s < sl, other=0), axis=0)
    return key, above, mass_above, ties


@triton.jit
def _kept(e, key, above, mass_above, ties, k, limit, min_p):
    """Mask of the kept tokens of a block (candidates above `key`, and the first ties at `key` that
    rank and mass allow, `ties` of them lying before the block) and the number of ties in the block.
    An unfiltered row passes key -1 and min_p 0: every token of positive probability is kept."""
    bits = e.to(tl.int32, bitcast=True)
    cand = (e > 0.0) & (e >= min_p)
    tie = (cand & (bits == key)).to(tl.int32)
    rank = ties + tl.cumsum(tie, axis=0) - tie  # ties before this one, in index order
    value = key.to(tl.float32, bitcast=True)
    keep_tie = (tie != 0) & (above + rank < k) & (mass_above + rank.to(tl.float32) * value < limit)
    return (cand & (bits > key)) | keep_tie, tl.sum(tie, axis=0)


@triton.jit
def _draw_kernel(e_ptr, greedy_ptr, filt_ptr, k_ptr, p_ptr, minp_ptr, seed_ptr, pos_ptr, sum_ptr, cnt_ptr,
                 mass_ptr, state_ptr, mstate_ptr, total_ptr, tok_ptr, last_ptr, B, V, DRAW: tl.constexpr,
                 PURPOSE_KEY: tl.constexpr, LENGTH: tl.constexpr, NS: tl.constexpr, NS_P2: tl.constexpr,
                 BLOCK: tl.constexpr, BINS: tl.constexpr, LEVELS: tl.constexpr):
    """DRAW=False: float64 kept mass per slice. DRAW=True: per slice, the first kept token whose CDF
    exceeds u * total and the last kept token (V and -1 when none)."""
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    if tl.load(greedy_ptr + row).to(tl.int32) == 0:
        filtered = tl.load(filt_ptr + row).to(tl.int32) != 0
        k = tl.load(k_ptr + row)
        limit = tl.load(p_ptr + row) * _row_sum(sum_ptr, row, NS, NS_P2)
        min_p = tl.where(filtered, tl.load(minp_ptr + row), 0.0)
        # read on every drawn row (the buffers exist), used on filtered ones
        key, above, mass_above, ties = _cut(cnt_ptr, mass_ptr, state_ptr, mstate_ptr, row, sl, B, k, limit,
                                            NS, NS_P2, BINS, LEVELS)
        key = tl.where(filtered, key, -1)
        ties = tl.where(filtered, ties, 0)
        offset = tl.zeros([], tl.float64)
        target = tl.zeros([], tl.float64)
        if DRAW:
            # slice prefix and total in one sequential order, so the last CDF value equals the total
            acc = tl.zeros([], tl.float64)
            for j in range(0, NS):
                offset = tl.where(j == sl, acc, offset)
                acc += tl.load(total_ptr + row * NS + j)
            target = _uniform(tl.load(seed_ptr + row), tl.load(pos_ptr + row), PURPOSE_KEY) * acc
        cols = tl.arange(0, BLOCK)
        run = tl.zeros([], tl.float64)
        first = tl.zeros([], tl.int32) + V
        last = tl.full([], -1, tl.int32)
        for start in range(sl * LENGTH, tl.minimum(sl * LENGTH + LENGTH, V), BLOCK):
            i = start + cols
            e = tl.load(e_ptr + row * V + i, mask=i < V, other=0.0)
            kept, n_ties = _kept(e, key, above, mass_above, ties, k, limit, min_p)
            ties += n_ties
            cs = tl.cumsum(tl.where(kept, e, 0.0).to(tl.float64), axis=0)
            if DRAW:
                cdf = offset + (run + cs)
                first = tl.minimum(first, tl.min(tl.where(kept & (cdf > target), i, V), axis=0))
                last = tl.maximum(last, tl.max(tl.where(kept, i, -1), axis=0))
            run = run + tl.sum(tl.where(cols == BLOCK - 1, cs, 0.0), axis=0)  # exactly the block's last CDF
        if DRAW:
            tl.store(tok_ptr + row * NS + sl, first)
            tl.store(last_ptr + row * NS + sl, last)
        else:
            tl.store(total_ptr + row * NS + sl, run)


@triton.jit
def _finish_kernel(greedy_ptr, max_ptr, arg_ptr, tok_ptr, last_ptr, out_ptr, V, ANY_DRAWN: tl.constexpr,
                   NS: tl.constexpr, NS_P2: tl.constexpr):
    row = tl.program_id(0)
    _, token = _row_max(max_ptr, arg_ptr, row, NS, NS_P2)
    if ANY_DRAWN:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if tl.load(greedy_ptr + row).to(tl.int32) == 0:
            s = tl.arange(0, NS_P2)
            first = tl.min(tl.load(tok_ptr + row * NS + s, mask=s < NS, other=V), axis=0)
            last = tl.max(tl.load(last_ptr + row * NS + s, mask=s < NS, other=-1), axis=0)
            token = tl.where(first < V, first, tl.where(last >= 0, last, token))
    tl.store(out_ptr + row, token.to(tl.int64))


def sample_tokens(logits: torch.Tensor, s: SamplingMetadata) -> torch.Tensor:
    """Reference `sample_tokens` (argmax on greedy rows; temperature, top-k / top-p / min-p and an
    inverse-CDF draw elsewhere) as row-wise kernels; see the module docstring for what is equal."""
    _check_logits(logits)
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, vocab = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    dev = x.device
    ns, length = _splits(vocab)
    ns_p2 = max(2, triton.next_power_of_2(ns))
    common = dict(LENGTH=length, NS=ns, NS_P2=ns_p2, BLOCK=_BLOCK, num_warps=4)
    mx = torch.empty((rows, ns), dtype=torch.float32, device=dev)
    arg = torch.empty((rows, ns), dtype=torch.int32, device=dev)
    _max_kernel[(rows, ns)](x, x.stride(0), mx, arg, vocab, LENGTH=length, NS=ns, BLOCK=_BLOCK, num_warps=4)
    tok = last = mx
    if s.any_drawn:
        e = torch.empty((rows, vocab), dtype=torch.float32, device=dev)
        sums = torch.empty((rows, ns), dtype=torch.float32, device=dev)
        _exp_sum_kernel[(rows, ns)](x, x.stride(0), e, s.temperature, s.greedy, mx, arg, sums, vocab,
                                    **common)
        cnt = torch.empty((_LEVELS, rows, ns, _BINS), dtype=torch.int32, device=dev)
        mass = torch.empty((_LEVELS, rows, ns, _BINS), dtype=torch.float32, device=dev)
        state = torch.empty((_LEVELS, rows, 2), dtype=torch.int32, device=dev)
        mstate = torch.empty((_LEVELS, rows), dtype=torch.float32, device=dev)
        if s.any_filtered:
            for level in range(_LEVELS):
                _radix_kernel[(rows, ns)](e, s.filtered, s.top_k, s.top_p, s.min_p, sums, cnt, mass, state,
                                          mstate, rows, vocab, LEVEL=level, BINS=_BINS, **common)
        totals = torch.empty((rows, ns), dtype=torch.float64, device=dev)
        tok = torch.empty((rows, ns), dtype=torch.int32, device=dev)
        last = torch.empty((rows, ns), dtype=torch.int32, device=dev)
        for draw in (False, True):
            _draw_kernel[(rows, ns)](e, s.greedy, s.filtered, s.top_k, s.top_p, s.min_p, s.seeds,
                                     s.positions, sums, cnt, mass, state, mstate, totals, tok, last, rows,
                                     vocab, DRAW=draw, PURPOSE_KEY=_purpose_key(rng.PURPOSE_SAMPLE),
                                     BINS=_BINS, LEVELS=_LEVELS, **common)
    _finish_kernel[(rows,)](s.greedy, mx, arg, tok, last, out, vocab, ANY_DRAWN=s.any_drawn, NS=ns,
                            NS_P2=ns_p2, num_warps=1)
    return out


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"sampling kernels take float32 logits [B, V], got {logits.dtype} "
                         f"{tuple(logits.shape)}")


# ---- apply_penalties ----------------------------------------------------------------------------------


@triton.jit
def _bias_kernel(x_ptr, stride, rows_ptr, ids_ptr, val_ptr, n, BLOCK: tl.constexpr):
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = j < n
    at = x_ptr + tl.load(rows_ptr + j, mask=m, other=0) * stride + tl.load(ids_ptr + j, mask=m, other=0)
    tl.atomic_add(at, tl.load(val_ptr + j, mask=m, other=0.0), mask=m)


@triton.jit
def _set_kernel(x_ptr, stride, rows_ptr, ids_ptr, value, n, BLOCK: tl.constexpr):
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = j < n
    at = x_ptr + tl.load(rows_ptr + j, mask=m, other=0) * stride + tl.load(ids_ptr + j, mask=m, other=0)
    tl.store(at, (tl.zeros([BLOCK], tl.float32) + value).to(x_ptr.dtype.element_ty), mask=m)


@triton.jit
def _count_kernel(cnt_ptr, vocab, rows_ptr, ids_ptr, first_ptr, n, BLOCK: tl.constexpr):
    """Occurrences per (row, token) into a zeroed scratch; `first` marks one pair per distinct token."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = j < n
    at = cnt_ptr + tl.load(rows_ptr + j, mask=m, other=0) * vocab + tl.load(ids_ptr + j, mask=m, other=0)
    old = tl.atomic_add(at, tl.full([BLOCK], 1, tl.int32), mask=m)
    tl.store(first_ptr + j, (old == 0).to(tl.int8), mask=m)


@triton.jit
def _frequency_kernel(x_ptr, stride, cnt_ptr, vocab, rows_ptr, ids_ptr, first_ptr, freq_ptr, pres_ptr, n,
                      BLOCK: tl.constexpr):
    """x -= frequency * count + presence, once per distinct (row, token)."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = (j < n) & (tl.load(first_ptr + j, mask=j < n, other=0) != 0)
    r = tl.load(rows_ptr + j, mask=m, other=0)
    t = tl.load(ids_ptr + j, mask=m, other=0)
    c = tl.load(cnt_ptr + r * vocab + t, mask=m, other=0).to(tl.float32)
    x = tl.load(x_ptr + r * stride + t, mask=m, other=0.0)
    pen = _mul_add(tl.load(freq_ptr + r, mask=m, other=0.0), c, tl.load(pres_ptr + r, mask=m, other=0.0))
    tl.store(x_ptr + r * stride + t, x - pen, mask=m)


@triton.jit
def _repetition_kernel(x_ptr, stride, rows_ptr, ids_ptr, first_ptr, rep_ptr, n, BLOCK: tl.constexpr):
    """Positive logits divided by the penalty, others multiplied, once per distinct (row, token)."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = (j < n) & (tl.load(first_ptr + j, mask=j < n, other=0) != 0)
    r = tl.load(rows_ptr + j, mask=m, other=0)
    at = x_ptr + r * stride + tl.load(ids_ptr + j, mask=m, other=0)
    x = tl.load(at, mask=m, other=0.0)
    rep = tl.load(rep_ptr + r, mask=m, other=1.0)
    tl.store(at, tl.where(x > 0, tl.math.div_rn(x, rep), x * rep), mask=m)


_PAIRS = 256  # (row, token) pairs per program of the scatter kernels


def _pair_grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, _PAIRS),)


def _first_of_each(rows: torch.Tensor, ids: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """Per pair: 1 for exactly one pair of each distinct (row, token), leaving the counts in `scratch`."""
    n = rows.numel()
    _set_kernel[_pair_grid(n)](scratch, scratch.stride(0), rows, ids, 0, n, BLOCK=_PAIRS)
    first = torch.empty(n, dtype=torch.int8, device=rows.device)
    _count_kernel[_pair_grid(n)](scratch, scratch.stride(0), rows, ids, first, n, BLOCK=_PAIRS)
    return first


def apply_penalties(logits: torch.Tensor, s: SamplingMetadata) -> torch.Tensor:
    """Reference `apply_penalties` (bias, min_tokens ban, presence/frequency, repetition) as scatters
    over the metadata's (row, token) pairs on a copy of the logits; `logits` itself when nothing applies."""
    if not s.any_adjusted:
        return logits
    _check_logits(logits)
    x = logits.clone(memory_format=torch.contiguous_format)
    stride = x.stride(0)
    if n := s.bias_ids.numel():
        _bias_kernel[_pair_grid(n)](x, stride, s.bias_rows, s.bias_ids, s.bias_values, n, BLOCK=_PAIRS)
    if n := s.ban_ids.numel():
        _set_kernel[_pair_grid(n)](x, stride, s.ban_rows, s.ban_ids, float("-inf"), n, BLOCK=_PAIRS)
    scratch = None
    if s.output_ids.numel() or s.seen_ids.numel():
        scratch = torch.empty(x.shape, dtype=torch.int32, device=x.device)  # only the pairs' cells are used
    if n := s.output_ids.numel():
        first = _first_of_each(s.output_rows, s.output_ids, scratch)
        _frequency_kernel[_pair_grid(n)](x, stride, scratch, scratch.stride(0), s.output_rows, s.output_ids,
                                         first, s.frequency, s.presence, n, BLOCK=_PAIRS)
    if n := s.seen_ids.numel():
        first = _first_of_each(s.seen_rows, s.seen_ids, scratch)
        _repetition_kernel[_pair_grid(n)](x, stride, s.seen_rows, s.seen_ids, first, s.repetition, n,
                                          BLOCK=_PAIRS)
    return x


# ---- apply_token_bitmask ------------------------------------------------------------------------------


@triton.jit
def _bitmask_kernel(x_ptr, x_stride, mask_ptr, mask_stride, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = i < V
    word = tl.load(mask_ptr + row * mask_stride + i // 32, mask=m, other=-1)
    x = tl.load(x_ptr + row * x_stride + i, mask=m, other=0.0)
    bias = tl.where(((word >> (i % 32)) & 1) != 0, 0.0, float("-inf")).to(x.dtype)
    tl.store(out_ptr + row * V + i, x + bias, mask=m)  # the reference's add: -0.0 -> 0.0, +inf -> nan


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Reference `apply_token_bitmask` in one elementwise pass (bit t % 32 of word t // 32 clear -> -inf)."""
    if (logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32
            or bitmask.shape[0] != logits.shape[0] or bitmask.shape[1] * 32 < logits.shape[1]):
        raise ValueError(f"apply_token_bitmask takes logits [B, V] and an int32 bitmask [B, ceil(V / 32)], "
                         f"got {tuple(logits.shape)} and {bitmask.dtype} {tuple(bitmask.shape)}")
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    mask = bitmask if bitmask.stride(-1) == 1 else bitmask.contiguous()
    rows, vocab = x.shape
    out = torch.empty((rows, vocab), dtype=x.dtype, device=x.device)
    if rows and vocab:
        block = 2048
        _bitmask_kernel[(rows, triton.cdiv(vocab, block))](x, x.stride(0), mask, mask.stride(0), out, vocab,
                                                           BLOCK=block, num_warps=8)
    return out
