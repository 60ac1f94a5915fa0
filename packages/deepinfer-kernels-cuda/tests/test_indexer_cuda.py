"""Lightning-indexer scores on the GPU against the reference, within the documented bound."""

import pytest
import torch

from deepinfer.cache.codecs import Codec
from deepinfer.ops.reference.cache_quant import QUANT_OPS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t,heads,dim,n", [(1, 32, 128, 5000), (3, 32, 128, 1), (70, 32, 128, 333),
                                           (5, 16, 32, 100), (2, 4, 32, 17)])
def test_indexer_logits_match_reference(cuda_ops, ref_ops, poison, t, heads, dim, n, dtype):
    torch.manual_seed(t * n)
    q = torch.randn(t, heads, dim, device="cuda", dtype=dtype)
    k = torch.randn(n, dim, device="cuda", dtype=dtype)
    w = torch.randn(t, heads, device="cuda", dtype=dtype) * heads**-0.5
    got, want = cuda_ops.indexer_logits(q, k, w), ref_ops.indexer_logits(q, k, w)
    assert got.shape == (t, n) and got.dtype == torch.float32
    # float32 dots differ by summation order (~1e-5 of sum_d |q_d k_d|); a per-head term rounded to
    # bf16 can then land one ulp (2^-7) away, twice (the dot and the weighted term)
    dots = torch.einsum("thd,nd->thn", q.double(), k.double())
    magnitude = torch.einsum("thd,nd->thn", q.double().abs(), k.double().abs())
    ulp = 2**-6 if dtype == torch.bfloat16 else 0.0
    bound = ((dots.relu() * ulp + magnitude * 1e-5) * w.double().abs().unsqueeze(-1)).sum(1) + 1e-6
    assert ((got.double() - want.double()).abs() <= bound).all()


def _topk_inputs(t: int, fmt: str, capacity: int, seed: int):
    """t rows over 3 sequences of paged index keys (64 entries a block), visible counts around k."""
    g = torch.Generator().manual_seed(seed)
    heads, dim, per_block = 32, 128, 64
    table = -(-capacity // per_block)
    codec = Codec(fmt, dim, torch.bfloat16)
    pool = codec.encode(torch.randn(3 * table * per_block, dim, generator=g), QUANT_OPS)
    pool = pool.view(3 * table, per_block, -1)
    q = torch.randn(t, heads, dim, generator=g).bfloat16()
    w = torch.randn(t, heads, generator=g) * heads**-0.5
    block_tables = torch.randperm(3 * table, generator=g).view(3, table)
    row_seg = torch.randint(0, 3, (t,), generator=g)
    visible = torch.randint(0, capacity + 1, (t,), generator=g)
    visible[0] = capacity
    visible[-1] = min(100, capacity)  # fewer than k visible: -1 padding
    return [x.cuda() for x in (q, w, pool)] + [codec] + [x.cuda() for x in (block_tables, row_seg, visible)]


def _reference_scores(ref_ops, q, w, pool, codec, block_tables, row_seg, visible, capacity):
    entries = torch.arange(capacity, device=q.device)
    rows = pool[block_tables[:, entries // pool.shape[1]], entries % pool.shape[1]]  # [seqs, capacity, bytes]
    keys = codec.decode(rows.flatten(0, 1), QUANT_OPS).unflatten(0, rows.shape[:2])
    scores = torch.stack([ref_ops.indexer_logits(q[r : r + 1], keys[row_seg[r]], w[r : r + 1])[0]
                          for r in range(q.shape[0])])
    return scores.masked_fill(entries >= visible.unsqueeze(-1), -torch.inf)


@pytest.mark.parametrize("fmt", ["mxfp4", "raw"])
@pytest.mark.parametrize("t,capacity,extra", [(1, 4096, None), (5, 4096, "allowed"), (70, 1024, "candidates"),
                                              (3, 32768, None), (2, 4096, "all blocks"),
                                              (160, 2048, None), (160, 2048, "all blocks")])  # row tiles
def test_indexer_topk_selects_the_best_entries(cuda_ops, ref_ops, poison, fmt, t, capacity, extra):
    assert "indexer_topk" not in cuda_ops.fallbacks
    args = _topk_inputs(t, fmt, capacity, seed=t)
    k = 512
    kwargs = {}
    if extra == "allowed":
        kwargs["allowed"] = torch.rand(t, capacity, device="cuda") < 0.5
    if extra == "candidates":
        kwargs["candidates"] = (4, 128)
    if extra == "all blocks":  # 512 blocks of 8, all kept: the scores kernel writes the mask
        kwargs["candidates"] = (512, 8)
    top, mask = cuda_ops.indexer_topk(*args, capacity, k, **kwargs)
    want_top, want_mask = ref_ops.indexer_topk(*args, capacity, k, **kwargs)
    scores = _reference_scores(ref_ops, *args, capacity)
    if "allowed" in kwargs:
        scores = scores.masked_fill(~kwargs["allowed"], -torch.inf)
    assert top.shape == (t, k) and top.dtype == torch.long
    for r in range(t):
        ids, want_ids = top[r][top[r] >= 0], want_top[r][want_top[r] >= 0]
        assert len(ids) == len(want_ids) == min(k, int(torch.isfinite(scores[r]).sum()))
        assert torch.equal(ids, ids.sort().values) and (top[r, len(ids) :] == -1).all()  # ascending, then -1s
        # the same entries up to near-ties: the chosen scores match the reference's choice in order
        tol = 2**-6 * float(scores[r][torch.isfinite(scores[r])].abs().max()) if len(ids) else 0.0
        chosen, want_chosen = scores[r, ids].sort().values, scores[r, want_ids].sort().values
        torch.testing.assert_close(chosen, want_chosen, atol=tol, rtol=0)
    if extra == "candidates":
        agree = (mask == want_mask).all(dim=1).float().mean()
        assert agree > 0.95, agree  # block maxima can swap order where scores differ by a rounding
    elif extra == "all blocks":
        assert torch.equal(mask, want_mask)
    else:
        assert mask is None and want_mask is None


@pytest.mark.parametrize("t", [1, 8, 64])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_select_paths_agree(t, ties):
    """The several-programs-per-row select (chosen for these row counts, run in a CUDA graph) gives the
    one-program path's ids exactly, and the k best scores."""
    from deepinfer_kernels_cuda.indexer import select_chunk, topk_select

    capacity, k = 32768, 512
    assert select_chunk(t, capacity) < capacity
    g = torch.Generator(device="cuda").manual_seed(t)
    scores = torch.randn(t, capacity, device="cuda", generator=g)
    if ties:
        scores = (scores * 2).round()
    scores[-1, 300:] = -torch.inf  # fewer than k visible
    allowed = torch.rand(t, capacity, device="cuda", generator=g) < 0.9
    for mask in (None, allowed):
        one = topk_select(scores, k, mask, chunk=capacity)
        topk_select(scores, k, mask)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = topk_select(scores, k, mask)
        graph.replay()
        assert torch.equal(got, one)
        masked = scores if mask is None else scores.masked_fill(~mask, -torch.inf)
        best = masked.topk(k, dim=-1).values
        for r in range(t):
            ids = got[r][got[r] >= 0]
            assert (got[r, len(ids) :] == -1).all() and torch.equal(ids, ids.sort().values)
            want = best[r][best[r] > -torch.inf]
            assert torch.equal(masked[r, ids].sort(descending=True).values, want)
