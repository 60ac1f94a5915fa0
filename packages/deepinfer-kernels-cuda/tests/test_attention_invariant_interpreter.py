"""Paged attention under Triton's CPU interpreter (switched on before triton is imported, hence a
subprocess per test), in float32 (the interpreter's bf16 dot is wrong).

Batch-invariant mode: the keys are split in fixed chunks (INVARIANT_SPLIT_KEYS per segment) and folded
in order, by a second kernel (few rows) or by the row's own program (many rows). A probe row's output
is bitwise the same alone and in batches of 3 and 8 (other companions, padding rows, wider index
arrays), whichever of the two fold paths runs, and close to the reference op. Probes: window +
compressed keys of 5 splits, exactly one or two splits, shorter than one split, a window under 128
keys, no compressed segment; exact (raw) and release (FP8 window + NVFP4 pool) cache; one Flash-width
case (64 heads x 512, two value halves). Value halves at every width cost the interpreter time: 12 minutes
on two loaded CPU cores (2026-12-02), hence the long timeout.

Decode tile variants (DECODE_VARIANTS): each against the reference, raw and release caches, with
split keys, windows that end inside a key tile, padding keys, a row without keys, value halves, a ring
whose slots are not adjacent; the ring bytes stored after the reads (by the kernel that merges the
splits, or after the op) equal the reference's, in both modes. A minute.
"""

import pytest

_SCRIPT = r"""
import torch
from deepinfer.cache.codecs import Codec
from deepinfer.ops.reference.attention import sparse_attention_paged as reference
from deepinfer.ops.reference.cache_quant import QUANT_OPS
from deepinfer_kernels_cuda import attention as ker

SLOTS, RING_LEN, PER_BLOCK, BLOCKS, SEQS, ENTRIES = 3, 128, 16, 64, 3, 40 * 16
S = ker.INVARIANT_SPLIT_KEYS
g = torch.Generator().manual_seed(0)


def world(fmt, heads, dim, with_pool=True):
    ring_codec, pool_codec = Codec(fmt[0], dim, torch.float32), Codec(fmt[1], dim, torch.float32)
    w = dict(heads=heads, dim=dim, ring_codec=ring_codec, sink=torch.randn(heads, generator=g),
             ring=ring_codec.encode(torch.randn(SLOTS * RING_LEN, dim, generator=g), QUANT_OPS)
             .view(SLOTS, RING_LEN, -1))
    if with_pool:
        pool = pool_codec.encode(torch.randn(BLOCKS * PER_BLOCK, dim, generator=g), QUANT_OPS)
        w.update(pool=pool.view(BLOCKS, PER_BLOCK, -1), pool_codec=pool_codec,
                 block_tables=torch.randint(0, BLOCKS, (SEQS, ENTRIES // PER_BLOCK), generator=g))
    return w


def row(w, n_win, n_top, seq=0, empty=False):
    # window ids: ring rows, -1 none, -2 = this row's own key of the step; topk: pool entries, -1 none
    win = torch.randint(0, SLOTS * RING_LEN, (n_win,), generator=g)
    win[torch.rand(n_win, generator=g) < 0.2] = -1
    if n_win:
        win[-1] = -2
    top = torch.randint(0, ENTRIES, (n_top,), generator=g)
    top[torch.rand(n_top, generator=g) < 0.2] = -1
    if empty:  # a padding row: no key at all
        win[:], top[:] = -1, -1
    # this step's key on the FP8 grid: the interpreter's FP8 encoder rounds unlike the reference's
    kv = torch.randint(-8, 9, (w["dim"],), generator=g).float() / 4
    return dict(q=torch.randn(w["heads"], w["dim"], generator=g), kv=kv, win=win, top=top, seq=seq)


def step(w, rows, width=0, extra=0):
    # one step's arguments, index arrays padded with -1 to the longest row (+ extra compressed slots)
    ring_rows = SLOTS * RING_LEN
    n_win = max(width, *(len(r["win"]) for r in rows))
    window = torch.full((len(rows), n_win), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        window[i, : len(r["win"])] = torch.where(r["win"] == -2, ring_rows + i, r["win"])
    none = torch.zeros(0, dtype=torch.long)
    args = [torch.stack([r["q"] for r in rows]), torch.stack([r["kv"] for r in rows]), w["ring"].clone(),
            w["ring_codec"], window, none, none, w["sink"], w["dim"] ** -0.5]
    kwargs = {}
    if "pool" in w:
        topk = torch.full((len(rows), max(len(r["top"]) for r in rows) + extra), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            topk[i, : len(r["top"])] = r["top"]
        kwargs = dict(pool=w["pool"], pool_codec=w["pool_codec"], topk=topk, block_tables=w["block_tables"],
                      row_seg=torch.tensor([r["seq"] for r in rows]))
    return args, kwargs


def invariant(args, kwargs, sms):
    ker._sm_count = lambda device: sms  # 132: few rows, a program per split; 1: each row folds its own
    return ker.sparse_attention_paged(*args, **kwargs, batch_invariant=True)


def check(w, n_win, n_top):
    probe = row(w, n_win, n_top, seq=1)
    args, kwargs = step(w, [probe])
    alone = invariant(args, kwargs, 132)
    torch.testing.assert_close(alone, reference(*args, **kwargs), atol=1e-5, rtol=1e-5)
    batches = [([row(w, 128, 2 * S + 5, 2), probe, row(w, 128, 0, empty=True)], 1, 128, 70),
               ([row(w, 20, 30, i % SEQS) for i in range(5)] + [probe] + [row(w, 7, 9, empty=True)] * 2, 5,
                0, S + 10)]
    for rows, at, width, extra in batches:
        args, kwargs = step(w, rows, width, extra)
        for sms in (132, 1):
            got = invariant(args, kwargs, sms)
            assert torch.equal(got[at], alone[0]), (n_win, n_top, len(rows), sms)
    assert torch.equal(invariant(*step(w, [probe]), 1)[0], alone[0])  # the fold in the row's own program
    ker._sm_count = lambda device: 132
    default = ker.sparse_attention_paged(*args, **kwargs)  # default mode: split by the row count
    torch.testing.assert_close(default, reference(*args, **kwargs), atol=1e-5, rtol=1e-5)


for fmt in (("raw", "raw"), ("fp8", "nvfp4")):
    w = world(fmt, 4, 64)
    for n_win, n_top in ((128, 512), (128, S), (S // 2, 2 * S), (50, 37), (1, 0)):
        check(w, n_win, n_top)
    check(world(fmt, 4, 64, with_pool=False), 100, 0)
check(world(("fp8", "nvfp4"), 64, 512), 64, 100)
print("ok")
"""


@pytest.mark.slow
def test_invariant_attention_is_bitwise_in_batches_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT, timeout=1500)


_VARIANTS_SCRIPT = r"""
import torch
from deepinfer.cache.codecs import Codec
from deepinfer.ops.reference.attention import sparse_attention_paged as reference
from deepinfer.ops.reference.cache_quant import QUANT_OPS
from deepinfer_kernels_cuda import attention as ker

g = torch.Generator().manual_seed(1)
HEADS, DIM, SLOTS, RING_LEN, PER_BLOCK, BLOCKS = 4, 64, 2, 32, 16, 12


def step(fmt, t, n_win, n_top, padded):
    ring_codec, pool_codec = Codec(fmt[0], DIM, torch.float32), Codec(fmt[1], DIM, torch.float32)
    ring = ring_codec.encode(torch.randn(SLOTS * RING_LEN, DIM, generator=g), QUANT_OPS)
    ring = ring.view(SLOTS, RING_LEN, -1)
    if padded:  # slots further apart than RING_LEN rows: the kernel's ring addressing by slot and entry
        ring = torch.cat((ring, torch.zeros_like(ring[:, :3])), dim=1)[:, :RING_LEN]
    pool = pool_codec.encode(torch.randn(BLOCKS * PER_BLOCK, DIM, generator=g), QUANT_OPS)
    window = torch.randint(0, SLOTS * RING_LEN, (t, n_win), generator=g)
    window[:, -1] = SLOTS * RING_LEN + torch.arange(t)  # each row's own key of the step
    topk = torch.randint(0, 4 * PER_BLOCK, (t, n_top), generator=g)
    window[torch.rand(t, n_win, generator=g) < 0.2] = -1
    topk[torch.rand(t, n_top, generator=g) < 0.2] = -1
    window[-1], topk[-1] = -1, -1  # a row without keys: the sink alone
    # this step's keys on the FP8 grid: the interpreter's FP8 encoder rounds unlike the reference's
    kv = torch.randint(-8, 9, (t, DIM), generator=g).float() / 4
    ring_dest = torch.randperm(SLOTS * RING_LEN, generator=g)[:t]  # stored after the reads
    ring_src = torch.randint(0, t, (t,), generator=g)
    args = [torch.randn(t, HEADS, DIM, generator=g), kv, ring, ring_codec, window,
            ring_dest, ring_src, torch.randn(HEADS, generator=g), DIM**-0.5]
    kwargs = dict(pool=pool.view(BLOCKS, PER_BLOCK, -1), pool_codec=pool_codec, topk=topk,
                  block_tables=torch.randint(0, BLOCKS, (2, 4), generator=g),
                  row_seg=torch.randint(0, 2, (t,), generator=g))
    return args, kwargs


cases = [(fmt, *shape) for fmt in (("raw", "raw"), ("fp8", "nvfp4"))
         for shape in ((1, 32, 61, False), (5, 7, 40, True))]
steps = [step(*case) for case in cases]
# the stage count and L2 prefetches change nothing under the interpreter: one variant of each shape
shapes = {(t.halves, t.block_n, t.num_warps): (name, t) for name, t in ker.DECODE_VARIANTS.items()}
for name, tiles in shapes.values():
    ker.DECODE_TILES = ker.STAGED_DECODE_TILES = ker.FEW_ROWS_DECODE_TILES = tiles
    for case, (args, kwargs) in zip(cases, steps):
        mine, theirs = list(args), list(args)
        mine[2], theirs[2] = args[2].clone(), args[2].clone()  # each op stores the step's keys in its ring
        got, want = ker.sparse_attention_paged(*mine, **kwargs), reference(*theirs, **kwargs)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name} {case} {m}")
        assert torch.equal(mine[2], theirs[2]), (name, case)
for case, (args, kwargs) in zip(cases, steps):  # invariant mode: the ring stored by the fold kernel
    mine, theirs = list(args), list(args)
    mine[2], theirs[2] = args[2].clone(), args[2].clone()
    got = ker.sparse_attention_paged(*mine, **kwargs, batch_invariant=True)
    torch.testing.assert_close(got, reference(*theirs, **kwargs), atol=1e-5, rtol=1e-5)
    assert torch.equal(mine[2], theirs[2]), case
print("ok")
"""


@pytest.mark.slow
def test_decode_variants_match_the_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_VARIANTS_SCRIPT, timeout=300)
