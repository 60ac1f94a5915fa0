"""Sparse attention with a per-head sink over one shared K=V head: gathered buffer and paged cache.

One kernel serves both ops. A query row's keys are two segments: "window" keys, indices into a ring
of cache rows (or, past the ring, into this step's freshly encoded rows), then optionally
"compressed" entries found through the sequence's block table in a paged pool. Each segment has its
own storage format (raw, FP8 + UE8M0/32, NVFP4 + E4M3/16, MXFP4 + UE8M0/32), decoded in registers to
the compute dtype (exact: every format's value times its power-of-two or E4M3 scale fits BF16), on
CUDA by packed PTX decodes for FP8 and NVFP4 (`cache_quant.decode_rows`).
`sparse_attention_sink` is the case of a raw ring that is the whole gathered buffer.

One program takes one query row with all its heads (a [heads, D] tile: each cache row is read once
for every head) over a range of its keys, with an online softmax in float32 and tensor-core
products (probabilities rounded to the compute dtype for the P.V product, as flash attention does).
Work is spread over the chip two ways:
* the value channels can be cut in two halves, one per program (each program still needs all D
  channels for the scores: it decodes its half and the other one, the other program reads the same
  rows from L2): half the float32 accumulator per program;
* for few query rows (decode), the keys are split into ranges whose partial results (normalised
  output and log-sum-exp) a second kernel merges together with the sink (and does the paged op's ring
  store: it runs after every read of the ring).
Prefill (many rows) runs one range per row and applies the sink in the first kernel.
The tiles and the split count depend on the number of rows (decode tiles also on the cache format).
Decode tiles on CUDA ask L2 for the rows of the next key tile before a tile's loads (a prefetch hint).
With `batch_invariant`, the keys are cut in fixed chunks of INVARIANT_SPLIT_KEYS positions, the window and
the compressed segment each from its own start, so a row's splits depend on its own keys only; each
split's (log-sum-exp, normalised output) is folded into the sink in split order by one sequential code
path (`_fold`), either by a second kernel (few rows: a program per split) or by the row's own program
(many rows), with floating-point contraction off so both give the same bits. Padding keys (-1) of a row's
index arrays add exact zeros and a split without a key changes nothing, so a row's result also does not
depend on how far the step's capacities (the longest sequence's) pad them.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from deepinfer_kernels_cuda.cache_quant import FORMATS, CacheRegion, cache_region, decode_rows, write_rows

if TYPE_CHECKING:
    from deepinfer.cache.codecs import Codec

_LOG2E = math.log2(math.e)
_MAX_HEADS = 64  # heads per program (one warpgroup-sized MMA tile)


@dataclass(frozen=True)
class Tiles:
    halves: bool  # two programs per row and key range, each with half the value channels (see _attend)
    block_n: int  # keys per step
    num_warps: int
    num_stages: int
    programs_per_sm: float = 1.0  # decode: split the keys while the grid stays under this many per SM
    min_split_keys: int = 64  # decode: fewest keys per split (each split re-reads q, writes [heads, D])
    l2_ahead: int = 0  # CUDA: tiles ahead whose rows are asked of L2 before a tile's loads (0: none)
    # Hopper, default mode, bf16 rows of 64 heads x 512 (`sparse_attention_sink`): the warp-specialised Gluon
    # kernel (attention_ws) with (keys a tile, ring buffers, producer warps, consumer registers); other cases:
    # the tiles above
    ws: tuple[int, int, int, int] | None = None
    # with ws: the warp-specialised kernel and the kernel merging its splits launched with programmatic
    # dependent launch (sm_90: a kernel's CTAs start while the kernel before ends, and wait for it before any
    # global read or write); 1: the kernel after launches when each ends, 2: once every CTA has waited;
    # pdl for the warp-specialised kernel (pdl_one_split where it has one split: no combine kernel after it),
    # combine_pdl for the combine kernel (None: as pdl); pdl 0: none of them
    pdl: int = 0
    combine_pdl: int | None = None
    pdl_one_split: int | None = None


# Decode tiles by name (benchmarks/kernels/attention.py times each). H200, 2026-12-02 12:17 UTC, Triton 3.6,
# ctx 64k (8k alike), graph µs at B = 1 / 64 / 128, bf16 | release caches (FP8 ring + NVFP4 pool):
# * "v1": all 512 value channels in one program ([64, 512] float32 accumulator: one program per SM),
#   64-key tiles: 12.7 / 43.5 / 62.7 | 18.2 / 48.5 / 76.9;
# * "v1s3": the same with the key tiles (raw caches) or their bytes (decoded ones) loaded 3 deep
#   (asynchronous copies into shared memory): 14.0 / 39.5 / 54.1 | 22.8 / 55.1 / 84.7: the decoded
#   formats stage bytes they then load, decode and store again. The pipeliner makes ids -> rows ->
#   products its three stages and issues a tile's copy after the products of the tile before, so no copy
#   runs under the products (a third 64 KB buffer does not fit beside q's 64 KB);
# * "v1a1", "v1s3a1": v1, v1s3 asking L2 for the next tile's rows before a tile's loads: 13.7 / 43.6 /
#   61.5 | 19.4 / 47.8 / 73.5 and 14.9 / 37.7 / 52.3 | 20.6 / 49.3 / 76.0 (8k, v1a1 release at B = 128:
#   76.2 -> 70.9): the HBM latency hides, the copy from L2 still waits;
# * "h32w4": value halves with one warpgroup, 32-key tiles, two programs per SM, keys split down to 32
#   per program: 10.9 / 49.9 / 76.4 | 15.3 / 62.2 / 104.4: more programs when there are few rows.
# Dropped in session 9: the next tile's rows into L1 for v1 (its loads go through L1; 12:31 UTC, release
# B = 128: 74.0 against v1a1's 73.7 us), L2 requests two tiles ahead (v1 / v1s3: 70.0 / 53.4 at bf16
# B = 128), 32-key tiles 5 deep (three buffers: the copies do run under the products, but twice the
# tiles' fixed work: 58.2 | 101.1), 64-key tiles 2 deep (timed in session 8: 58.1 | 103.7); in session 6:
# 16-key halves, also 3 deep; in session 5: 16/32-key tiles 3-4 deep, rescaling only when a maximum grew.
# * "ws32x4" (session 10): the warp-specialised Gluon kernel (attention_ws; bf16 rows of
#   sparse_attention_sink on Hopper, v1s3a1's tiles elsewhere): 32-key tiles 4 deep gathered by a producer
#   warpgroup while two consumer warpgroups compute; 14:59 UTC, bf16 64k / 8k at B = 64: 30.3 / 31.4, B = 128:
#   46.1 / 45.6 (v1s3a1 in that run: 37.5 / 38.1, 52.2 / 52.1); "ws32x4p": the producer warps as the default
#   partition. Dropped: 64-key tiles 2 deep (ws64x2: 33.4 / 48.8 at B = 64 / 128, 64k), 32-key tiles 5 deep
#   (as 4 deep), q's first 128 columns held in registers (15:13 UTC: 31.9 / 46.6 us, 30.8 / 45.6 with the
#   producer first, against ws32x4's 30.7 / 46.4), the next tile's scores issued before a tile's softmax
#   (ptxas then serialises every wgmma: C7514).
# * "sh32x4" (session 11, the default there): ws32x4's ring with the consumers taking the score tiles in turn
#   (each scores every other tile for both and hands P, maximum and row sums over through shared memory);
#   17:02 / 17:18 UTC, bf16 64k / 8k at B = 64: 29.5 / 30.2 and 29.1 / 29.9, B = 128: 41.4 / 39.7 and 41.1 /
#   39.9 (ws32x4 in the first run: 30.5 / 31.7, 46.6 / 46.0). Dropped: ws32x4 and ws32x4p (each consumer
#   scoring every tile), the producer as the default partition (28.4 / 29.4, 41.5 / 40.5), one split at B =
#   64 (programs_per_sm 0.5: 33.6 / 33.8), the producer asking L2 for the rows 2 / 4 tiles ahead (B = 128:
#   43.6 / 47.5 at 64k, 42.4 / 44.7 at 8k), the splits merged in the kernel by the consumer that stores its
#   half of a row last (a counter per row and half; B = 64: 38.2 / 39.0, the merge's L2 reads in one
#   warpgroup take longer than the combine kernel).
# * "pdl", "pdlx" (session 12): sh32x4 with the warp-specialised kernel and the combine kernel launched with
#   programmatic dependent launch (each waits for the kernel before it, then "pdl" lets the next launch at
#   once, "pdlx" when it ends); "pdl1": pdl with one split at B = 64 (programs_per_sm 0.5); "pdlm": pdl for
#   the warp-specialised kernel, pdlx for the combine kernel. H200, 20:05 and 20:08 UTC (two runs), bf16 64k /
#   8k, graph µs at B = 64: default 29.4 / 30.0, pdl 29.7 / 30.4, pdlx 28.0 / 28.0, pdlm 28.9 / 28.7, pdl1
#   32.4 / 32.3; B = 128 (one split: no combine kernel): default 41.0-41.3 / 39.5-39.6, pdl 40.0 / 38.4-38.5,
#   pdlx 40.8 / 39.0, pdlm 39.7 / 38.4. An early trigger of the combine kernel (4096 programs, several waves)
#   lets the next decode take SMs that its later waves need; the warp-specialised kernel's early trigger helps
#   where no kernel runs between it and the next decode. "pdla" (the default): pdlx, with pdl's decode launch
#   where there is one split, so each of these cases runs the launches of its best variant (pdlx at B = 64,
#   pdl at B = 128).
# FEW_ROWS_DECODE_TILES takes B <= 13 at 640 keys a row.
DECODE_VARIANTS = {
    "v1": Tiles(halves=False, block_n=64, num_warps=8, num_stages=1),
    "v1s3": Tiles(halves=False, block_n=64, num_warps=8, num_stages=3),
    "h32w4": Tiles(halves=True, block_n=32, num_warps=4, num_stages=1, programs_per_sm=2, min_split_keys=32),
    "v1a1": Tiles(halves=False, block_n=64, num_warps=8, num_stages=1, l2_ahead=1),
    "v1s3a1": Tiles(halves=False, block_n=64, num_warps=8, num_stages=3, l2_ahead=1),
    "sh32x4": Tiles(False, 64, 8, 3, l2_ahead=1, ws=(32, 4, 4, 232)),
    "pdl": Tiles(False, 64, 8, 3, l2_ahead=1, ws=(32, 4, 4, 232), pdl=2),
    "pdlx": Tiles(False, 64, 8, 3, l2_ahead=1, ws=(32, 4, 4, 232), pdl=1),
    "pdlm": Tiles(False, 64, 8, 3, l2_ahead=1, ws=(32, 4, 4, 232), pdl=2, combine_pdl=1),
    "pdla": Tiles(False, 64, 8, 3, l2_ahead=1, ws=(32, 4, 4, 232), pdl=1, pdl_one_split=2),
    "pdl1": Tiles(False, 64, 8, 3, programs_per_sm=0.5, l2_ahead=1, ws=(32, 4, 4, 232), pdl=2),
}
DECODE_TILES = DECODE_VARIANTS["v1a1"]
# DECODE_TILES where every key is a raw 2-byte row (nothing to decode): the tiles go straight to shared memory
# (the warp-specialised kernel where it serves the call, v1s3a1's tiles elsewhere)
STAGED_DECODE_TILES = DECODE_VARIANTS["pdla"]
# decode steps too small for DECODE_TILES to give every SM a program (rows x its most splits < SMs)
FEW_ROWS_DECODE_TILES = DECODE_VARIANTS["h32w4"]
PREFILL_TILES = Tiles(halves=False, block_n=64, num_warps=8, num_stages=1)
# batch-invariant mode: keys per split, a multiple of block_n (a Flash decode row, 128 window keys + 512
# compressed, makes 5 splits whatever the batch); value halves so that FOLD's running numerator fits in
# registers next to the split's accumulator
INVARIANT_SPLIT_KEYS = 128
INVARIANT_TILES = Tiles(halves=True, block_n=64, num_warps=8, num_stages=1)
_FOLD_HEADS = 16  # heads per program of _fold_kernel


@triton.jit
def _attend(q, q2, v, k2, valid, dvb, D, m_i, l_i, acc, scale_log2, HALVES: tl.constexpr,
            PRECISION: tl.constexpr):
    """One online-softmax step over the decoded key rows v (`valid` ones only; K = V). HALVES: v holds
    the program's value half (q's columns of it) and k2 the other half (q2's); the scores are the two
    products summed in column order whichever half the program keeps, so both programs of a row
    compute the same bits (they store one log-sum-exp to the same place)."""
    # Scores to probabilities under a branch always taken (D > 0): Triton then does not see a chain of
    # two products and spreads the score tile's keys over the warpgroups, where for a chain every
    # warpgroup would compute all the scores (8 warps: twice the score products and softmax work).
    if D > 0:
        if not HALVES:
            logits = tl.dot(q, tl.trans(v), input_precision=PRECISION)
        elif dvb == 0:
            logits = tl.dot(q, tl.trans(v), input_precision=PRECISION)
            logits = tl.dot(q2, tl.trans(k2), logits, input_precision=PRECISION)
        else:
            logits = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
            logits = tl.dot(q, tl.trans(v), logits, input_precision=PRECISION)
        logits = tl.where(valid[None, :], logits * scale_log2, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(v.dtype)
    else:
        m_new, alpha = m_i, tl.full(m_i.shape, 1.0, tl.float32)
        p = tl.zeros((q.shape[0], v.shape[0]), v.dtype)
    acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _attend_rows(q, q2, rows, valid, dvb, D, m_i, l_i, acc, scale_log2, FMT: tl.constexpr,
                 HALVES: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
                 TY: tl.constexpr, ASM: tl.constexpr):
    """`_attend` over the key rows at pointers `rows`, loaded and decoded here. HALVES: the program's
    value half and the other half are decoded once each."""
    if HALVES:
        v = decode_rows(rows, 0, valid, dvb * BLOCK_DV, D, FMT, BLOCK_DV, TY, ASM)
        k2 = decode_rows(rows, 0, valid, (1 - dvb) * BLOCK_DV, D, FMT, BLOCK_DV, TY, ASM)
    else:
        v = decode_rows(rows, 0, valid, 0, D, FMT, BLOCK_D, TY, ASM)
        k2 = v
    return _attend(q, q2, v, k2, valid, dvb, D, m_i, l_i, acc, scale_log2, HALVES, PRECISION)


@triton.jit
def _window_ids(win_ptr, t, win_stride, start, hi, BLOCK_N: tl.constexpr):
    """Window key ids of the tile at `start` (int32, -1 past `hi`)."""
    n = start + tl.arange(0, BLOCK_N)
    return tl.load(win_ptr + t.to(tl.int64) * win_stride + n, mask=n < hi, other=-1).to(tl.int32)


@triton.jit
def _window_rows(r, ring_ptr, ring_s0, ring_s1, ring_rows, cur_ptr, cur_stride, RING_LEN: tl.constexpr,
                 HAS_CURRENT: tl.constexpr):
    """Row pointers of window ids r: ring rows, flat (RING_LEN 0: row r at r * ring_s1) or RING_LEN to a
    ring slot (a division by a constant), or this step's encoded rows past the ring."""
    in_ring = (r >= 0) & (r < ring_rows)
    rr = tl.where(in_ring, r, 0)
    if RING_LEN == 0:
        rows = ring_ptr + rr.to(tl.int64) * ring_s1
    else:
        slot, entry = (rr // RING_LEN).to(tl.int64), (rr % RING_LEN).to(tl.int64)
        rows = ring_ptr + (slot * ring_s0 + entry * ring_s1)
    if HAS_CURRENT:  # one load through per-row pointers
        rows = tl.where(in_ring, rows, cur_ptr + tl.maximum(r - ring_rows, 0).to(tl.int64) * cur_stride)
    return rows


@triton.jit
def _pool_ids(topk_ptr, t, topk_stride, start, W, hi, BLOCK_N: tl.constexpr):
    """Compressed entry ids of the tile at key position `start` (int32, -1 past `hi`)."""
    n = start + tl.arange(0, BLOCK_N)
    return tl.load(topk_ptr + t.to(tl.int64) * topk_stride + (n - W), mask=n < hi, other=-1).to(tl.int32)


@triton.jit
def _pool_blocks(j, bt_ptr, seq, bt_stride, PER_BLOCK: tl.constexpr):
    """Pool blocks of entries j, through the sequence's block table."""
    jj = tl.where(j >= 0, j, 0)
    return tl.load(bt_ptr + seq * bt_stride + jj // PER_BLOCK, mask=j >= 0, other=0).to(tl.int64)


@triton.jit
def _pool_rows(j, block, pool_ptr, pool_s0, pool_s1, PER_BLOCK: tl.constexpr):
    return pool_ptr + (block * pool_s0 + (tl.where(j >= 0, j, 0) % PER_BLOCK) * pool_s1)


@triton.jit
def _prefetch_l2(rows, valid, nbytes, LINES: tl.constexpr):
    """Asks L2 for the first `nbytes` of the `valid` rows at pointers `rows`, a 128-byte line per
    instruction: a hint that holds no registers or shared memory and returns nothing."""
    c = tl.arange(0, LINES) * 128
    lines = rows.to(tl.pointer_type(tl.uint8), bitcast=True)[:, None] + c[None, :]
    on = (valid[:, None] & (c < nbytes)[None, :]).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }", "=r,l,r",
        [lines, on], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _keys(q, q2, t, lo, hi, win_ptr, win_stride, W, ring_ptr, ring_s0, ring_s1, ring_rows,
          cur_ptr, cur_stride, ring_bytes, topk_ptr, topk_stride, pool_ptr, pool_s0, pool_s1, pool_bytes,
          bt_ptr, bt_stride, seg_ptr, dvb, D, scale_log2, RING_LEN: tl.constexpr, PER_BLOCK: tl.constexpr,
          RING_FMT: tl.constexpr, POOL_FMT: tl.constexpr,
          HAS_CURRENT: tl.constexpr, HAS_POOL: tl.constexpr, HALVES: tl.constexpr, L2_AHEAD: tl.constexpr,
          L2_LINES: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
          BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, TY: tl.constexpr, ASM: tl.constexpr):
    """Online softmax of row t over its keys lo..hi (window positions < W, then compressed entries).
    Key ids in int32 (fewer registers), byte offsets in int64.
    L2_AHEAD > 0: each step first asks L2 for the rows of the tile L2_AHEAD tiles ahead (within lo..hi),
    so that their HBM reads run under the products of the tiles before it. Triton's pipeliner alone gives
    ids -> rows -> products one stage each and issues a tile's copy after the products of the tile
    before: the copy then waits for HBM with nothing to overlap (a third buffer of 64-key rows does not
    fit in shared memory with q)."""
    m_i = tl.full((BLOCK_H,), -1.0e30, tl.float32)  # finite: an all-padding block must not make NaNs
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)
    win_hi = tl.minimum(hi, W)
    if L2_AHEAD > 0:  # the ids of the tile ahead are loaded one step before their use (no wait on them)
        ra = _window_ids(win_ptr, t, win_stride, lo + L2_AHEAD * BLOCK_N, win_hi, BLOCK_N)
    for start in range(lo, win_hi, BLOCK_N):
        r = _window_ids(win_ptr, t, win_stride, start, win_hi, BLOCK_N)
        if L2_AHEAD > 0:
            rows = _window_rows(ra, ring_ptr, ring_s0, ring_s1, ring_rows, cur_ptr, cur_stride, RING_LEN,
                                HAS_CURRENT)
            _prefetch_l2(rows, ra >= 0, ring_bytes, L2_LINES)
            ra = _window_ids(win_ptr, t, win_stride, start + (L2_AHEAD + 1) * BLOCK_N, win_hi, BLOCK_N)
        rows = _window_rows(r, ring_ptr, ring_s0, ring_s1, ring_rows, cur_ptr, cur_stride, RING_LEN,
                            HAS_CURRENT)
        m_i, l_i, acc = _attend_rows(q, q2, rows, r >= 0, dvb, D, m_i, l_i, acc, scale_log2, RING_FMT, HALVES,
                                     BLOCK_D, BLOCK_DV, PRECISION, TY, ASM)
    if HAS_POOL:
        seq = tl.load(seg_ptr + t).to(tl.int64)
        p_lo = tl.maximum(lo, W)
        if L2_AHEAD > 0:  # ids two steps and their blocks one step before their use
            ja = _pool_ids(topk_ptr, t, topk_stride, p_lo + L2_AHEAD * BLOCK_N, W, hi, BLOCK_N)
            ja1 = _pool_ids(topk_ptr, t, topk_stride, p_lo + (L2_AHEAD + 1) * BLOCK_N, W, hi, BLOCK_N)
            ba = _pool_blocks(ja, bt_ptr, seq, bt_stride, PER_BLOCK)
        for start in range(p_lo, hi, BLOCK_N):
            j = _pool_ids(topk_ptr, t, topk_stride, start, W, hi, BLOCK_N)
            if L2_AHEAD > 0:
                rows = _pool_rows(ja, ba, pool_ptr, pool_s0, pool_s1, PER_BLOCK)
                _prefetch_l2(rows, ja >= 0, pool_bytes, L2_LINES)
                ba = _pool_blocks(ja1, bt_ptr, seq, bt_stride, PER_BLOCK)
                ja = ja1
                ja1 = _pool_ids(topk_ptr, t, topk_stride, start + (L2_AHEAD + 2) * BLOCK_N, W, hi, BLOCK_N)
            block = _pool_blocks(j, bt_ptr, seq, bt_stride, PER_BLOCK)
            rows = _pool_rows(j, block, pool_ptr, pool_s0, pool_s1, PER_BLOCK)
            m_i, l_i, acc = _attend_rows(q, q2, rows, j >= 0, dvb, D, m_i, l_i, acc, scale_log2, POOL_FMT,
                                         HALVES, BLOCK_D, BLOCK_DV, PRECISION, TY, ASM)
    return m_i, l_i, acc


@triton.jit
def _split_range(s, keys_per_split, win_splits, pool_base, W, K):
    """Key positions lo..hi of split s. Default mode: win_splits = pool_base = 0, window and compressed
    keys cut as one sequence. Invariant mode: pool_base = W, the compressed keys cut from their own start."""
    in_window = s < win_splits
    lo = tl.where(in_window, s * keys_per_split, pool_base + (s - win_splits) * keys_per_split)
    return lo, tl.minimum(lo + keys_per_split, tl.where(in_window, W, W + K))


@triton.jit
def _normalise(m_i, l_i, acc):
    """A split's (log2-sum-exp2, normalised output); -inf and zeros when it saw no key."""
    lse = tl.where(l_i > 0, m_i + tl.log2(l_i), -float("inf"))
    return lse, tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)


@triton.jit
def _fold(top, den, num, lse, o):
    """Adds one split to the running (max, denominator, numerator) of a row; a split without a key
    leaves them exactly as they are (not even a zero's sign changes)."""
    new = tl.maximum(top, lse)
    a = tl.exp2(top - new)
    b = tl.exp2(lse - new)
    live = lse > -float("inf")
    den = tl.where(live, den * a + b, den)
    num = tl.where(live[:, None], num * a[:, None] + b[:, None] * o, num)
    return tl.where(live, new, top), den, num


# table widths and split counts are not specialised (== 1, multiple of 16): fewer kernels per batch bucket
@triton.jit(do_not_specialize=["n_splits", "bt_stride"])
def _attention_kernel(
    q_ptr, out_ptr, part_ptr, lse_ptr, sink_ptr, heads, D, keys_per_split, n_splits, win_splits, pool_base,
    scale_log2, q_stride_t, q_stride_h,
    win_ptr, win_stride, W, ring_ptr, ring_s0, ring_s1, ring_rows, cur_ptr, cur_stride, ring_bytes,
    topk_ptr, topk_stride, K, pool_ptr, pool_s0, pool_s1, pool_bytes, bt_ptr, bt_stride, seg_ptr,
    RING_LEN: tl.constexpr, PER_BLOCK: tl.constexpr, RING_FMT: tl.constexpr, POOL_FMT: tl.constexpr,
    HAS_CURRENT: tl.constexpr, HAS_POOL: tl.constexpr,
    SPLIT: tl.constexpr, FOLD: tl.constexpr, HALVES: tl.constexpr, L2_AHEAD: tl.constexpr,
    L2_LINES: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, TY: tl.constexpr, ASM: tl.constexpr,
):
    t = tl.program_id(0)
    hb, dvb = tl.program_id(2) // (2 if HALVES else 1), tl.program_id(2) % (2 if HALVES else 1)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    dv = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    d2 = (1 - dvb) * BLOCK_DV + tl.arange(0, BLOCK_DV)  # HALVES: the other half's columns
    hmask = h < heads
    q_at = q_ptr + t.to(tl.int64) * q_stride_t + h[:, None] * q_stride_h
    q = tl.load(q_at + dv[None, :], mask=hmask[:, None] & (dv < D)[None, :], other=0.0).to(TY)
    q2 = q
    if HALVES:
        q2 = tl.load(q_at + d2[None, :], mask=hmask[:, None] & (d2 < D)[None, :], other=0.0).to(TY)
    omask = hmask[:, None] & (dv < D)[None, :]
    out_at = out_ptr + t.to(tl.int64) * q_stride_t + h[:, None] * q_stride_h + dv[None, :]
    sink = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
    if FOLD:  # invariant mode, many rows: this program folds the row's splits in order
        top, den, num = sink, tl.full((BLOCK_H,), 1.0, tl.float32), tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)
        for s in range(n_splits):
            lo, hi = _split_range(s, keys_per_split, win_splits, pool_base, W, K)
            m_i, l_i, acc = _keys(
                q, q2, t, lo, hi, win_ptr, win_stride, W, ring_ptr, ring_s0, ring_s1, ring_rows, cur_ptr,
                cur_stride, ring_bytes, topk_ptr, topk_stride, pool_ptr, pool_s0, pool_s1, pool_bytes, bt_ptr,
                bt_stride, seg_ptr, dvb, D, scale_log2, RING_LEN, PER_BLOCK, RING_FMT, POOL_FMT, HAS_CURRENT,
                HAS_POOL, HALVES, L2_AHEAD, L2_LINES, BLOCK_H, BLOCK_N, BLOCK_D, BLOCK_DV, PRECISION, TY, ASM)
            lse, o = _normalise(m_i, l_i, acc)
            top, den, num = _fold(top, den, num, lse, o)
        tl.store(out_at, (num / den[:, None]).to(out_ptr.dtype.element_ty), mask=omask)
    else:
        s = tl.program_id(1)
        lo, hi = _split_range(s, keys_per_split, win_splits, pool_base, W, K)
        m_i, l_i, acc = _keys(
            q, q2, t, lo, hi, win_ptr, win_stride, W, ring_ptr, ring_s0, ring_s1, ring_rows, cur_ptr,
            cur_stride, ring_bytes, topk_ptr, topk_stride, pool_ptr, pool_s0, pool_s1, pool_bytes, bt_ptr,
            bt_stride, seg_ptr, dvb, D, scale_log2, RING_LEN, PER_BLOCK, RING_FMT, POOL_FMT, HAS_CURRENT,
            HAS_POOL, HALVES, L2_AHEAD, L2_LINES, BLOCK_H, BLOCK_N, BLOCK_D, BLOCK_DV, PRECISION, TY, ASM)
        if SPLIT:
            row = (t * n_splits + s).to(tl.int64) * heads + h
            lse, o = _normalise(m_i, l_i, acc)
            tl.store(part_ptr + row[:, None] * D + dv[None, :], o, mask=omask)
            tl.store(lse_ptr + row, lse, mask=hmask)  # every value half computes the same value
        else:
            top = tl.maximum(m_i, sink)
            a = tl.exp2(m_i - top)
            o = acc * (a / (l_i * a + tl.exp2(sink - top)))[:, None]
            tl.store(out_at, o.to(out_ptr.dtype.element_ty), mask=omask)


@triton.jit
def _store_ring_rows(enc_ptr, enc_stride, ring_ptr, ring_len, ring_s0, ring_s1, nbytes, dest_ptr, src_ptr,
                     n_store, BLOCK_B: tl.constexpr):
    """Rows j = program_id(0), + the grid's rows, ... < n_store of the step's ring store: ring row dest[j]
    = encoded row src[j] (bytes). Run by the kernel after the attention kernel: every ring read is done."""
    c = tl.arange(0, BLOCK_B)
    for j in range(tl.program_id(0), n_store, tl.num_programs(0)):
        src = tl.load(src_ptr + j).to(tl.int64)
        dest = tl.load(dest_ptr + j).to(tl.int64)
        row = tl.load(enc_ptr + src * enc_stride + c, mask=c < nbytes)
        at = ring_ptr + (dest // ring_len) * ring_s0 + (dest % ring_len) * ring_s1
        tl.store(at + c, row, mask=c < nbytes)


@triton.jit(do_not_specialize=["n_store"])
def _combine_kernel(
    part_ptr, lse_ptr, sink_ptr, out_ptr, heads, D, n_splits, out_stride_t, out_stride_h,
    enc_ptr, enc_stride, ring_ptr, ring_len, ring_s0, ring_s1, nbytes, dest_ptr, src_ptr, n_store,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, STORE: tl.constexpr, BLOCK_B: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    t, h = tl.program_id(0), tl.program_id(1)
    if PDL:  # launched while the kernel writing the partials ends: wait for it before any read or write
        gdc_wait()
        if PDL == 2:
            gdc_launch_dependents()
    if STORE:  # by the programs of head 0
        _store_ring_rows(enc_ptr, enc_stride, ring_ptr, ring_len, ring_s0, ring_s1, nbytes, dest_ptr, src_ptr,
                         tl.where(h == 0, n_store, 0), BLOCK_B)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    row = (t * n_splits + s).to(tl.int64) * heads + h
    lse = tl.load(lse_ptr + row, mask=s < n_splits, other=-float("inf"))
    sink = tl.load(sink_ptr + h).to(tl.float32) * 1.4426950408889634
    top = tl.maximum(tl.max(lse, axis=0), sink)
    w = tl.exp2(lse - top)
    o = tl.load(part_ptr + row[:, None] * D + d[None, :], mask=(s < n_splits)[:, None] & (d < D)[None, :],
                other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / (tl.sum(w, axis=0) + tl.exp2(sink - top))
    tl.store(out_ptr + t.to(tl.int64) * out_stride_t + h * out_stride_h + d, out.to(out_ptr.dtype.element_ty),
             mask=d < D)


@triton.jit(do_not_specialize=["n_store"])
def _fold_kernel(
    part_ptr, lse_ptr, sink_ptr, out_ptr, heads, D, n_splits, out_stride_t, out_stride_h,
    enc_ptr, enc_stride, ring_ptr, ring_len, ring_s0, ring_s1, nbytes, dest_ptr, src_ptr, n_store,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, STORE: tl.constexpr, BLOCK_B: tl.constexpr,
):
    """Invariant mode, few rows: the splits of row t folded into the sink in order, as FOLD does."""
    t = tl.program_id(0)
    if STORE:  # by the programs of the first heads
        _store_ring_rows(enc_ptr, enc_stride, ring_ptr, ring_len, ring_s0, ring_s1, nbytes, dest_ptr, src_ptr,
                         tl.where(tl.program_id(1) == 0, n_store, 0), BLOCK_B)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hmask = h < heads
    omask = hmask[:, None] & (d < D)[None, :]
    top = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
    den, num = tl.full((BLOCK_H,), 1.0, tl.float32), tl.zeros((BLOCK_H, BLOCK_D), tl.float32)
    for s in range(n_splits):
        row = (t * n_splits + s).to(tl.int64) * heads + h
        lse = tl.load(lse_ptr + row, mask=hmask, other=-float("inf"))
        o = tl.load(part_ptr + row[:, None] * D + d[None, :], mask=omask, other=0.0)
        top, den, num = _fold(top, den, num, lse, o)
    tl.store(out_ptr + t.to(tl.int64) * out_stride_t + h[:, None] * out_stride_h + d[None, :],
             (num / den[:, None]).to(out_ptr.dtype.element_ty), mask=omask)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the Triton interpreter on CPU: plan as for an H200
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class RingStore:
    """The step's ring store: ring [A, E, nbytes] uint8 row dest[j] = encoded [n, nbytes] row src[j]."""

    ring: torch.Tensor
    dest: torch.Tensor
    src: torch.Tensor
    encoded: torch.Tensor


def _attention(
    q: torch.Tensor, sink: torch.Tensor, scale: float, window: torch.Tensor, ring: CacheRegion, ring_len: int,
    ring_rows: int, current: torch.Tensor | None, topk: torch.Tensor | None = None,
    pool: CacheRegion | None = None,
    block_tables: torch.Tensor | None = None, row_seg: torch.Tensor | None = None, fp32: bool = False,
    batch_invariant: bool = False, store: RingStore | None = None,
) -> tuple[torch.Tensor, bool]:
    """(output, whether `store` was done: by the kernel that merges the splits, which runs after every
    read of the ring; the caller does it otherwise)."""
    t, heads, d = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out, False
    q, window, sink = q.contiguous(), window.contiguous(), sink.float().contiguous()
    w = window.shape[1]
    k = w + (0 if topk is None else topk.shape[1])
    block_h = max(16, min(_MAX_HEADS, triton.next_power_of_2(heads)))
    block_d = max(16, triton.next_power_of_2(d))
    sms = _sm_count(q.device)
    row_programs = t * triton.cdiv(heads, block_h)
    few_rows = row_programs * (2 if PREFILL_TILES.halves else 1) < sms
    ty = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}.get(q.dtype, tl.float32)
    ty = tl.float32 if fp32 else ty
    if batch_invariant:  # each segment in fixed chunks from its own start: splits set by the row's keys
        tiles, keys_per_split = INVARIANT_TILES, INVARIANT_SPLIT_KEYS
        win_splits, pool_base = triton.cdiv(w, keys_per_split), w
        splits = max(1, win_splits + triton.cdiv(k - w, keys_per_split))
        split, fold = few_rows, not few_rows
    else:
        tiles, splits, win_splits, pool_base, fold = PREFILL_TILES, 1, 0, 0, False
        if few_rows:  # split the keys
            staged = ring.fmt == FORMATS["raw"] and (pool is None or pool.fmt == FORMATS["raw"])
            tiles = STAGED_DECODE_TILES if staged and ty != tl.float32 else DECODE_TILES
            if row_programs * triton.cdiv(k, tiles.min_split_keys) < sms:
                tiles = FEW_ROWS_DECODE_TILES
            programs = row_programs * (2 if tiles.halves else 1)
            wanted = max(1, int(tiles.programs_per_sm * sms) // programs)  # no partial last wave
            splits = min(wanted, triton.cdiv(k, tiles.min_split_keys))
        keys_per_split = triton.cdiv(max(1, triton.cdiv(k, tiles.block_n)), max(1, splits)) * tiles.block_n
        splits = max(1, triton.cdiv(k, keys_per_split))
        split = splits > 1
    halves = tiles.halves and block_d >= 64  # halves of whole scale groups (32 columns)
    block_dv = block_d // 2 if halves else block_d
    if split:
        part = torch.empty(t, splits, heads, d, dtype=torch.float32, device=q.device)
        lse = torch.empty(t, splits, heads, dtype=torch.float32, device=q.device)
    else:
        part = lse = out  # unused
    has_current, has_pool = current is not None, topk is not None
    if not has_current:
        current = ring.data  # unused
    if has_pool:
        topk, block_tables, row_seg = topk.contiguous(), block_tables.contiguous(), row_seg.contiguous()
    else:
        topk, block_tables, row_seg, pool = window, window, window, ring  # unused
    ring_bytes, pool_bytes = (r.data.shape[-1] * r.data.element_size() for r in (ring, pool))  # per row
    # invariant mode: no contraction into FMAs, so FOLD and _fold_kernel round every step alike
    exact = {"enable_fp_fusion": False} if batch_invariant else {}
    grid = (t, splits if split else 1, triton.cdiv(heads, block_h) * (2 if halves else 1))
    pdl = 0  # the combine kernel's launch: programmatic after the warp-specialised kernel if tiles ask
    if _warp_specialised(tiles, q, ring, ring_len, has_current, has_pool, window, batch_invariant):
        from deepinfer_kernels_cuda import attention_ws

        ws_pdl = tiles.pdl and (tiles.pdl_one_split or tiles.pdl) if splits == 1 else tiles.pdl
        pdl = tiles.pdl and (tiles.combine_pdl or tiles.pdl)
        attention_ws.decode(q, ring.data, window, sink, scale * _LOG2E, out, part, lse, keys_per_split,
                            splits, tiles.ws, pdl=ws_pdl)
    else:
        _attention_kernel[grid](
            q, out, part, lse, sink, heads, d, keys_per_split, splits, win_splits, pool_base, scale * _LOG2E,
            q.stride(0), q.stride(1),
            window, window.stride(0), w, ring.data, ring.stride0, ring.stride1, ring_rows,
            current, current.stride(-2), ring_bytes, topk, topk.stride(0), k - w,
            pool.data, pool.stride0, pool.stride1, pool_bytes, block_tables, block_tables.stride(0), row_seg,
            RING_LEN=0 if ring.stride0 == ring_len * ring.stride1 else ring_len,
            PER_BLOCK=pool.data.shape[1] if has_pool else 1,
            RING_FMT=ring.fmt, POOL_FMT=pool.fmt, HAS_CURRENT=has_current, HAS_POOL=has_pool, SPLIT=split,
            FOLD=fold, HALVES=halves, L2_AHEAD=tiles.l2_ahead if q.device.type == "cuda" else 0,  # inline PTX
            L2_LINES=triton.next_power_of_2(triton.cdiv(max(ring_bytes, pool_bytes), 128)),
            BLOCK_H=block_h, BLOCK_N=tiles.block_n, BLOCK_D=block_d, BLOCK_DV=block_dv,
            PRECISION="ieee" if ty == tl.float32 else "tf32", TY=ty,
            ASM=q.device.type == "cuda" and ty == tl.bfloat16,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, **exact,
        )
    if not split:
        return out, False
    if store is None:
        enc, store_args, block_b = out, (0, out, 0, 0, 0, 0, out, out, 0), 1  # unused
    else:
        enc, rb = store.encoded, store.ring
        store_args = (enc.stride(0), rb, rb.shape[1], rb.stride(0), rb.stride(1), rb.shape[2], store.dest,
                      store.src, store.dest.shape[0])
        block_b = triton.next_power_of_2(rb.shape[2])
    if batch_invariant:
        _fold_kernel[(t, triton.cdiv(heads, _FOLD_HEADS))](
            part, lse, sink, out, heads, d, splits, out.stride(0), out.stride(1), enc, *store_args,
            BLOCK_H=_FOLD_HEADS, BLOCK_D=block_d, STORE=store is not None, BLOCK_B=block_b, **exact,
        )
    else:
        _combine_kernel[(t, heads)](
            part, lse, sink, out, heads, d, splits, out.stride(0), out.stride(1), enc, *store_args,
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, STORE=store is not None, BLOCK_B=block_b,
            **({"PDL": pdl, "launch_pdl": True} if pdl else {}),
        )
    return out, store is not None


def _warp_specialised(tiles: Tiles, q: torch.Tensor, ring: CacheRegion, ring_len: int, has_current: bool,
                      has_pool: bool, window: torch.Tensor, batch_invariant: bool) -> bool:
    """Whether `tiles` asks for the warp-specialised kernel and it serves this call: default mode, flat raw
    bf16 rows and nothing else (the gathered buffer of `sparse_attention_sink`), 64 heads x 512, Hopper."""
    if tiles.ws is None or batch_invariant or has_current or has_pool or ring.fmt != FORMATS["raw"]:
        return False
    if ring.stride0 != ring_len * ring.stride1 or ring.data.dim() != 2:
        return False
    from deepinfer_kernels_cuda import attention_ws

    return attention_ws.supported(q, ring.data, window)


def sparse_attention_sink(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, scale: float, *,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """o[t, h] = sum_k softmax_k(q[t, h] . kv[i_tk] * scale | sink[h]) kv[i_tk].

    q [T, heads, D]; kv [N, D]; indices [T, K] into kv, -1 = no key; sink [heads]. -> q's dtype.
    """
    t, heads, d = q.shape
    if kv.shape[-1] != d or indices.shape[0] != t or sink.shape != (heads,):
        raise ValueError(f"sparse_attention_sink: q {tuple(q.shape)}, kv {tuple(kv.shape)}, indices "
                         f"{tuple(indices.shape)}, sink {tuple(sink.shape)} do not fit")
    if kv.stride(-1) != 1:
        kv = kv.contiguous()
    n = max(1, kv.shape[0])
    ring = CacheRegion(kv, FORMATS["raw"], n * kv.stride(0), kv.stride(0))  # flat rows
    return _attention(q, sink, scale, indices, ring, n, n, None, fp32=kv.dtype == torch.float32,
                      batch_invariant=batch_invariant)[0]


def sparse_attention_paged(
    q: torch.Tensor,
    kv: torch.Tensor,
    ring: torch.Tensor,
    ring_codec: "Codec",
    window: torch.Tensor,
    ring_dest: torch.Tensor,
    ring_src: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    *,
    pool: torch.Tensor | None = None,
    pool_codec: "Codec | None" = None,
    topk: torch.Tensor | None = None,
    block_tables: torch.Tensor | None = None,
    row_seg: torch.Tensor | None = None,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """One attention layer over every row of a step: window keys from the SWA ring (or this step's
    keys, encoded like cached ones) + selected compressed entries from the paged pool + sink; then
    this step's keys are stored in the ring (ring[ring_dest] = encode(kv)[ring_src]).
    Same contract as the reference op (deepinfer.ops.reference.attention.sparse_attention_paged)."""
    if (pool is None) != (topk is None) or (topk is not None and (block_tables is None or row_seg is None)):
        raise ValueError("sparse_attention_paged: give pool, pool_codec, topk, block_tables, row_seg or none")
    if ring_codec.format == "raw":
        encoded = kv.to(ring_codec.dtype).contiguous().view(torch.uint8)  # Codec.encode: a view, no copy
    else:  # one launch instead of quantize + concatenate
        encoded = torch.empty(kv.shape[0], ring_codec.nbytes, dtype=torch.uint8, device=kv.device)
        write_rows(encoded.unsqueeze(0), None, kv, ring_codec)
    current = cache_region(encoded.unsqueeze(0), ring_codec.format, ring_codec.dtype)
    ring_seg = cache_region(ring, ring_codec.format, ring_codec.dtype)
    fp32 = ring_codec.format == "raw" and ring_codec.dtype == torch.float32
    pool_seg = None
    if pool is not None:
        pool_seg = cache_region(pool, pool_codec.format, pool_codec.dtype)
        fp32 |= pool_codec.format == "raw" and pool_codec.dtype == torch.float32
    out, stored = _attention(q, sink, scale, window, ring_seg, ring.shape[1], ring.shape[0] * ring.shape[1],
                             current.data[0], topk, pool_seg, block_tables, row_seg, fp32, batch_invariant,
                             RingStore(ring, ring_dest.contiguous(), ring_src.contiguous(), encoded))
    if not stored:
        # after the kernel read the ring (a long step's rows may overwrite keys its first rows read): the
        # same bytes as `encoded`, gathered, encoded and scattered in one launch
        write_rows(ring, ring_dest, kv, ring_codec, src=ring_src)
    return out
