"""The indexer top-k select under Triton's CPU interpreter: the several-programs-per-row path (small
chunks forced) gives exactly the one-program path's ids, and both equal a torch oracle with the same
rule (largest by order key, ties to the lowest ids, ids ascending, then -1), on tied scores, -inf tails,
allowed masks, k above the visible count and capacities that are no multiple of the chunk. Then the
whole op (paged raw keys, the path chosen on the host) against the reference op on integer inputs whose
scores are exact in any summation order, and its candidate-block mask; the scores kernel's row tiles
(prefill) against one row per program. The interpreter must be switched on before triton is imported,
hence a subprocess."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.cache.codecs import Codec
from deepinfer.ops.reference.cache_quant import QUANT_OPS
from deepinfer.ops.reference.indexer import candidate_blocks, indexer_logits, indexer_topk as ref_topk
import deepinfer_kernels_cuda.indexer as ixm
from deepinfer_kernels_cuda.indexer import indexer_topk, paged_scores, select_chunk, tile_rows, topk_select

INF = float("inf")


def oracle(scores, k, allowed=None):
    bits = scores.view(torch.int32).long() & 0xFFFFFFFF
    key = torch.where(bits >= 2**31, 0xFFFFFFFF - bits, bits | 2**31)  # float order as unsigned ints
    ok = scores > -INF if allowed is None else (scores > -INF) & allowed
    key = torch.where(ok, key, -1)
    key = torch.nn.functional.pad(key, (0, max(0, k - key.shape[1])), value=-1)
    best = key.sort(dim=-1, descending=True, stable=True).indices[:, :k]  # equal keys: lowest id first
    width = key.shape[1]
    best = torch.where(key.gather(-1, best) >= 0, best, width).sort(dim=-1).values
    return torch.where(best < width, best, -1)


def check(scores, k, allowed=None, chunks=(64, 256)):
    want = oracle(scores, k, allowed)
    one = topk_select(scores, k, allowed, chunk=scores.shape[1])  # one program per row
    assert torch.equal(one, want), (one, want)
    for chunk in chunks:
        assert chunk < scores.shape[1]
        got = topk_select(scores, k, allowed, chunk=chunk)
        assert torch.equal(got, want), (chunk, got, want)


g = torch.Generator().manual_seed(0)
# quantised scores: long runs of ties across chunk borders, the k-th score tied many times
check(torch.randint(-3, 4, (3, 1000), generator=g).float() * 0.5, 100)
# -0.0 and +0.0 (ordered by their bits), every score equal, and negative scores
s = torch.zeros(2, 700)
s[0, ::3] = -0.0
s[1] = -1.5
check(s, 300)
# -inf tails (visible < capacity), one row with nothing visible, k above the visible count
s = torch.randn(5, 1500, generator=g)
for row, visible in enumerate((1500, 1000, 37, 0, 513)):
    s[row, visible:] = -INF
check(s, 512, chunks=(128,))
# allowed masks with ties, capacity not a multiple of the chunk, k > capacity
s = torch.randint(0, 8, (4, 2500), generator=g).float()
check(s, 512, torch.rand(4, 2500, generator=g) < 0.3, chunks=(256,))
check(s[:2, :333].contiguous(), 400, torch.rand(2, 333, generator=g) < 0.9, chunks=(64,))
# one row, random scores, large capacity, a 1024-multiple chunk
check(torch.randn(1, 3000, generator=g), 512, chunks=(1024,))

# the host's choice: several programs per row for few rows, one per row once rows fill the GPU
assert select_chunk(1, 32768) == 1024 and select_chunk(64, 32768) == 7168
assert select_chunk(264, 32768) == 32768 and select_chunk(1, 1000) == 1000
for bad in (100, 1500):
    try:
        topk_select(s, 8, chunk=bad)
        raise SystemExit(f"chunk {bad} accepted")
    except ValueError as e:
        assert "chunk" in str(e)

# the whole op against the reference: integer queries, MXFP4-exact integer keys, unit weights -> exact
# scores in any summation order (float32: under the interpreter the bf16 scores come out wrong)
heads, dim, per_block, capacity, t, k = 4, 32, 64, 2100, 3, 512
codec = Codec("mxfp4", dim, torch.float32)
table = -(-capacity // per_block)
pool = codec.encode(torch.randint(-4, 5, (2 * table * per_block, dim), generator=g).float(), QUANT_OPS)
pool = pool.view(2 * table, per_block, -1)
q = torch.randint(-4, 5, (t, heads, dim), generator=g).float()
w = torch.ones(t, heads)
block_tables = torch.randperm(2 * table, generator=g).view(2, table)
row_seg = torch.tensor([0, 1, 0])
visible = torch.tensor([capacity, 1200, 300])
entries = torch.arange(capacity)
keys = codec.decode(pool.flatten(0, 1), QUANT_OPS).view(2 * table, per_block, dim)
seq_keys = keys[block_tables[:, entries // per_block], entries % per_block]
scores = torch.stack([indexer_logits(q[r : r + 1], seq_keys[row_seg[r]], w[r : r + 1])[0] for r in range(t)])
scores = scores.masked_fill(entries >= visible[:, None], -INF)
allowed = torch.rand(t, capacity, generator=g) < 0.7
assert select_chunk(t, capacity) < capacity  # the op takes the several-programs path
args = (q, w, pool, codec, block_tables, row_seg, visible, capacity, k)
for kw in ({}, {"allowed": allowed}):
    top, _ = indexer_topk(*args, **kw)
    want, _ = ref_topk(*args, **kw)
    row_scores = scores if not kw else scores.masked_fill(~allowed, -INF)
    assert torch.equal(top, oracle(row_scores, k))
    for r in range(t):  # the reference breaks ties its own way: the same count and chosen scores
        ids, want_ids = top[r][top[r] >= 0], want[r][want[r] >= 0]
        assert len(ids) == len(want_ids) and (top[r, len(ids) :] == -1).all()
        assert torch.equal(row_scores[r, ids].sort().values, row_scores[r, want_ids].sort().values)
# candidate sources (263 blocks of 8 per row): the reference's mask of these scores, written by the scores
# kernel when every block is kept, else computed from the scores by the reference's code
for topk_blocks in (263, 300, 100):
    _, mask = indexer_topk(*args, candidates=(topk_blocks, 8))
    assert torch.equal(mask, candidate_blocks(scores, visible, topk_blocks, 8)), topk_blocks

# row tiles (prefill): the same scores, candidate mask and zeroed digit counts as one row per program, with
# tiles of one sequence and tiles that mix three (one pass per sequence) and partial tiles and entry blocks
assert tile_rows(127, 1, 32, False) == 1 and tile_rows(128, 1, 32, False) == 8  # rows, sequences, heads
assert tile_rows(256, 256, 32, False) == 1 and tile_rows(256, 64, 32, False) == 1  # decode / verification
assert tile_rows(512, 64, 32, False) == 8 and tile_rows(128, 1, 16, False) == 16  # 256-row products
assert tile_rows(4096, 1, 32, True) == 1  # batch-invariant
t, capacity = 21, 200
q = torch.randint(-4, 5, (t, heads, dim), generator=g).float()
w = torch.randint(1, 3, (t, heads), generator=g).float()
row_seg = torch.cat([torch.zeros(8, dtype=torch.long), torch.randint(0, 2, (13,), generator=g)])
visible = torch.randint(0, capacity + 1, (t,), generator=g)
visible[:8] = torch.arange(8) * 25
out = {}
for block_t, key_tiles in ((1, 4), (8, 4), (8, 1)):  # key tiles per program: one chunk, or 4 of them
    ixm._TILE_BLOCKS = key_tiles
    hist = torch.full((4, t, 256), 7, dtype=torch.int32)
    got = (torch.empty(t, capacity), torch.empty(t, capacity, dtype=torch.bool), hist)
    paged_scores(q, w, pool, codec, block_tables, row_seg, visible, got[0], mask=got[1], cand=8, hist=got[2],
                 block_t=block_t)
    out[block_t, key_tiles] = got
entries = torch.arange(capacity)
want = torch.stack([indexer_logits(q[r : r + 1], seq_keys[row_seg[r], :capacity], w[r : r + 1])[0]
                    for r in range(t)]).masked_fill(entries >= visible[:, None], -INF)
for got in out.values():
    assert torch.equal(got[0], want) and torch.equal(got[1], candidate_blocks(want, visible, 100, 8))
    assert not got[2].any()
print("ok")
"""


def test_chunked_topk_select_matches_one_program_and_oracle_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT, timeout=600)

