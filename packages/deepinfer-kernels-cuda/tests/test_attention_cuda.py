"""Sparse sink attention on the GPU against the reference: decode (split keys) and prefill rows."""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from deepinfer.cache.codecs import Codec
from deepinfer.ops.reference.cache_quant import QUANT_OPS
from deepinfer_kernels_cuda import attention
from deepinfer_kernels_cuda.attention import sparse_attention_paged
from deepinfer_kernels_cuda.cache_quant import FORMATS, decode_rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _inputs(t: int, heads: int, dim: int, n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, heads, dim, generator=g).to(dtype).cuda()
    kv = torch.randn(n, dim, generator=g).to(dtype).cuda()
    idx = torch.randint(0, n, (t, k), generator=g)
    idx[torch.rand(t, k, generator=g) < 0.3] = -1  # padding inside the rows
    if t > 1:
        idx[-1] = -1  # a row with no key: only the sink
        idx[0, k // 2 :] = -1  # a short context
    return q, kv, idx.cuda(), (torch.randn(heads, generator=g) * 2).cuda(), dim**-0.5


@pytest.mark.parametrize(
    "t,heads,dim,n,k",
    [(1, 64, 512, 20000, 640), (4, 64, 512, 3000, 640), (300, 64, 512, 5000, 640), (7, 64, 512, 100, 5),
     (3, 8, 64, 50, 40), (200, 8, 64, 500, 130), (5, 128, 512, 700, 96),
     (64, 64, 512, 5008, 640), (50, 8, 64, 500, 130)],  # the last two: STAGED_DECODE_TILES
)
def test_sparse_attention_sink_bf16(cuda_ops, ref_ops, poison, t, heads, dim, n, k):
    args = _inputs(t, heads, dim, n, k, torch.bfloat16, seed=t * k)
    got, want = cuda_ops.sparse_attention_sink(*args), ref_ops.sparse_attention_sink(*args)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 5e-3, err
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("t,n,k", [(2, 40, 17), (150, 300, 70)])
def test_sparse_attention_sink_fp32(cuda_ops, ref_ops, poison, t, n, k):
    args = _inputs(t, 4, 32, n, k, torch.float32, seed=k)
    torch.testing.assert_close(cuda_ops.sparse_attention_sink(*args), ref_ops.sparse_attention_sink(*args),
                               atol=1e-5, rtol=1e-5)


def test_int32_indices(cuda_ops, ref_ops):
    q, kv, idx, sink, scale = _inputs(2, 64, 512, 1000, 200, torch.bfloat16, seed=3)
    torch.testing.assert_close(cuda_ops.sparse_attention_sink(q, kv, idx.int(), sink, scale),
                               ref_ops.sparse_attention_sink(q, kv, idx, sink, scale), atol=2e-2, rtol=2e-2)


def _paged_inputs(t: int, fmt: tuple[str, str], seed: int, with_pool: bool = True):
    """A step of t rows over 3 sequences: SWA ring (3 slots x 128) + paged pool (64 entries a block)."""
    g = torch.Generator().manual_seed(seed)
    heads, dim, slots, ring_len, per_block, blocks = 64, 512, 3, 128, 64, 40
    ring_codec, pool_codec = Codec(fmt[0], dim, torch.bfloat16), Codec(fmt[1], dim, torch.bfloat16)
    ring = ring_codec.encode(torch.randn(slots * ring_len, dim, generator=g), QUANT_OPS)
    pool = pool_codec.encode(torch.randn(blocks * per_block, dim, generator=g), QUANT_OPS)
    q = torch.randn(t, heads, dim, generator=g).bfloat16()
    kv = torch.randn(t, dim, generator=g).bfloat16()
    window = torch.randint(0, slots * ring_len + t, (t, 128), generator=g)
    window[torch.rand(t, 128, generator=g) < 0.2] = -1
    window[0, 5:] = -1  # a row early in its sequence
    dest = torch.randperm(slots * ring_len, generator=g)[:t]
    args = [q, kv, ring.view(slots, ring_len, -1), ring_codec, window, dest, torch.arange(t),
            torch.randn(heads, generator=g), dim**-0.5]
    kwargs = {}
    if with_pool:
        topk = torch.randint(0, 8 * per_block, (t, 512), generator=g)
        topk[torch.rand(t, 512, generator=g) < 0.2] = -1
        topk[-1] = -1  # a row with no compressed entry
        kwargs = dict(pool=pool.view(blocks, per_block, -1), pool_codec=pool_codec, topk=topk,
                      block_tables=torch.randint(0, blocks, (3, 8), generator=g),
                      row_seg=torch.randint(0, 3, (t,), generator=g))
    return [_cuda(a) for a in args], {k: _cuda(v) for k, v in kwargs.items()}


def _cuda(x):
    return x.cuda() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("fmt", [("fp8", "nvfp4"), ("raw", "raw")])
@pytest.mark.parametrize("t,with_pool", [(1, True), (6, True), (300, True), (4, False)])
def test_sparse_attention_paged(cuda_ops, ref_ops, poison, fmt, t, with_pool):
    assert "sparse_attention_paged" not in cuda_ops.fallbacks
    args, kwargs = _paged_inputs(t, fmt, seed=t, with_pool=with_pool)
    ref_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    got = cuda_ops.sparse_attention_paged(*args, **kwargs)
    want = ref_ops.sparse_attention_paged(*ref_args, **kwargs)
    assert torch.equal(args[2], ref_args[2])  # this step's keys stored in the ring, same bytes
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 5e-3, err
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("variant", sorted(attention.DECODE_VARIANTS))
def test_decode_variants_match_reference(cuda_ops, ref_ops, poison, monkeypatch, variant):
    """Every decode tile variant (split keys, padding inside rows, a row without keys, a 16-key row)
    at Flash width, gathered bf16 buffer and release-precision paged caches."""
    monkeypatch.setattr(attention, "DECODE_TILES", attention.DECODE_VARIANTS[variant])
    monkeypatch.setattr(attention, "STAGED_DECODE_TILES", attention.DECODE_VARIANTS[variant])
    monkeypatch.setattr(attention, "FEW_ROWS_DECODE_TILES", attention.DECODE_VARIANTS[variant])
    # buffer sizes multiples of 16, as in benchmarks/kernels/attention.py: the same compiled kernels
    for t, n, k in ((1, 20000, 640), (8, 3008, 640), (64, 5008, 640), (3, 112, 16)):
        args = _inputs(t, 64, 512, n, k, torch.bfloat16, seed=t + k)
        got, want = cuda_ops.sparse_attention_sink(*args), ref_ops.sparse_attention_sink(*args)
        assert (got.float() - want.float()).norm() / want.float().norm() < 5e-3, (t, n, k)
    for t in (1, 6, 64):
        args, kwargs = _paged_inputs(t, ("fp8", "nvfp4"), seed=t)
        ref_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        got = cuda_ops.sparse_attention_paged(*args, **kwargs)
        want = ref_ops.sparse_attention_paged(*ref_args, **kwargs)
        assert (got.float() - want.float()).norm() / want.float().norm() < 5e-3, t
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("base", ["v1", "v1s3"])
def test_l2_requests_change_no_bit(monkeypatch, base):
    """Asking L2 for the next tile's rows is a hint: the same bits as the same tiles without it (split
    keys, padding, a row without keys; gathered bf16 buffer and release-precision paged caches)."""
    outs = []
    for name in (base, base + "a1"):
        for attr in ("DECODE_TILES", "STAGED_DECODE_TILES", "FEW_ROWS_DECODE_TILES"):
            monkeypatch.setattr(attention, attr, attention.DECODE_VARIANTS[name])
        sink_args = _inputs(64, 64, 512, 5008, 640, torch.bfloat16, seed=9)
        args, kwargs = _paged_inputs(64, ("fp8", "nvfp4"), seed=9)  # a fresh ring: the op stores into it
        outs.append((attention.sparse_attention_sink(*sink_args), sparse_attention_paged(*args, **kwargs)))
    assert attention.DECODE_VARIANTS[base + "a1"].l2_ahead > 0
    for without, with_requests in zip(*outs):
        assert torch.equal(without, with_requests)



@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the warp-specialised decode kernel is for Hopper")
def test_default_bf16_decode_runs_warp_specialised(cuda_ops, ref_ops, poison, monkeypatch):
    """At Flash width the default decode of bf16 rows runs attention_ws (one split per row at 128 rows,
    several below, an odd tile count in a split; int64 and int32 ids; padding and a row without keys),
    matches the reference and gives the same bits twice."""
    from deepinfer_kernels_cuda import attention_ws

    calls = []
    decode = attention_ws.decode
    monkeypatch.setattr(attention_ws, "decode", lambda *a, **k: calls.append(a[-1]) or decode(*a, **k))
    for t, n, k in ((14, 5008, 640), (64, 5008, 640), (128, 9000, 640), (100, 700, 100), (50, 3000, 200)):
        q, kv, idx, sink, scale = _inputs(t, 64, 512, n, k, torch.bfloat16, seed=t)
        for ids in (idx, idx.int()):
            got = cuda_ops.sparse_attention_sink(q, kv, ids, sink, scale)
            assert torch.equal(got, cuda_ops.sparse_attention_sink(q, kv, ids, sink, scale))
            want = ref_ops.sparse_attention_sink(q, kv, idx, sink, scale)
            assert (got.float() - want.float()).norm() / want.float().norm() < 5e-3, (t, k)
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert calls and all(tiles == attention.STAGED_DECODE_TILES.ws for tiles in calls)
    assert len(calls) == 20  # 5 cases x 2 id types x 2 runs


@triton.jit
def _late_copy_kernel(a_src, a_dst, na, b_src, b_dst, nb, spins, BLOCK: tl.constexpr):
    """Lets the kernel after it launch at once (programmatic dependent launch), spins, then copies the 32-bit
    words of a and b: a kernel after it that reads a_dst or b_dst before its grid-dependency wait reads what
    was there before."""
    gdc_launch_dependents()
    x = tl.program_id(0).to(tl.float32)
    for _ in range(spins):
        x = x * 0.999 + 1.0
    keep = x > -1.0  # always: the copy waits for the loop
    for start in range(tl.program_id(0) * BLOCK, na, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(a_dst + offs, tl.where(keep, tl.load(a_src + offs, mask=offs < na), 0), mask=offs < na)
    for start in range(tl.program_id(0) * BLOCK, nb, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(b_dst + offs, tl.where(keep, tl.load(b_src + offs, mask=offs < nb), 0), mask=offs < nb)


def _words(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1).view(torch.int32)


class _LateInputs:
    """q and the ids of a decode written by a kernel that lets the next one start before it writes them (q
    poisoned with NaN, the ids with -1 before): an attention kernel launched with PDL that read them before
    its grid-dependency wait would give NaN or sink-only rows."""

    def __init__(self, t: int, seed: int):
        self.src_q, self.kv, self.src_idx, self.sink, self.scale = _inputs(t, 64, 512, 5008, 640,
                                                                           torch.bfloat16, seed)
        self.q, self.idx = torch.empty_like(self.src_q), torch.empty_like(self.src_idx)

    def write(self):
        _words(self.q).fill_(0x7FC07FC0)  # bf16 NaN pairs
        self.idx.fill_(-1)
        a, b = _words(self.src_q), _words(self.src_idx)
        _late_copy_kernel[(8,)](a, _words(self.q), a.numel(), b, _words(self.idx), b.numel(), 20000,
                                BLOCK=1024)

    def step(self):
        self.write()
        return attention.sparse_attention_sink(self.q, self.kv, self.idx, self.sink, self.scale)


def _use_tiles(monkeypatch, tiles):
    for attr in ("DECODE_TILES", "STAGED_DECODE_TILES", "FEW_ROWS_DECODE_TILES"):
        monkeypatch.setattr(attention, attr, tiles)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the warp-specialised decode kernel is for Hopper")
@pytest.mark.parametrize("variant", sorted(n for n, v in attention.DECODE_VARIANTS.items() if v.pdl))
def test_pdl_decode_is_bitwise_the_ordinary_launch(monkeypatch, variant):
    """The warp-specialised decode (and the kernel merging its splits) launched with programmatic dependent
    launch gives the bits of the ordinary launch of the same tiles, eagerly and in a CUDA graph, right after
    a kernel that lets it start early and writes q and the ids late (a read before the wait would show):
    B = 1 (10 splits), 64 (2 splits, one for pdl1), 128 (one)."""
    from deepinfer_kernels_cuda import attention_ws

    pdl_tiles = attention.DECODE_VARIANTS[variant]
    plain_tiles = dataclasses.replace(pdl_tiles, pdl=0)
    calls = []
    decode = attention_ws.decode
    monkeypatch.setattr(attention_ws, "decode", lambda *a, **k: calls.append(k["pdl"]) or decode(*a, **k))
    for t in (1, 64, 128):
        case = _LateInputs(t, seed=t + 1)
        outs = {}
        for name, tiles in (("plain", plain_tiles), ("pdl", pdl_tiles)):
            _use_tiles(monkeypatch, tiles)
            outs[name] = case.step().clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = case.step()
            for _ in range(2):
                graph.replay()
                torch.cuda.synchronize()
                outs[name + " graph"] = out.clone()
                assert torch.equal(outs[name + " graph"], outs[name]), (t, name)
        assert outs["plain"].isfinite().all() and outs["plain"].abs().sum() > 0
        assert torch.equal(outs["pdl"], outs["plain"]), t
        assert torch.equal(outs["pdl graph"], outs["plain"]), t
    assert len(calls) == 12 and calls.count(0) == 6  # (eager + capture) x 3 batches, PDL and not
    want = attention.sparse_attention_sink(case.src_q, case.kv, case.src_idx, case.sink, case.scale)
    assert torch.equal(outs["pdl"], want)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the warp-specialised decode kernel is for Hopper")
def test_pdl_test_would_see_a_missing_wait():
    """The check of the test above: the kernel launched with PDL but built without its wait reads q and the
    ids before _late_copy_kernel writes them (skipped, not failed, where the launch did not overlap)."""
    from deepinfer_kernels_cuda import attention_ws

    case = _LateInputs(128, seed=7)
    case.write()
    torch.cuda.synchronize()
    want = attention.sparse_attention_sink(case.q, case.kv, case.idx, case.sink, case.scale)
    bad = 0
    for _ in range(3):
        case.write()
        out = torch.empty_like(case.q)
        q, idx = case.q, case.idx
        attention_ws._ws_decode_kernel[(128, 1)](
            q, q.stride(0), q.stride(1), case.kv, case.kv.stride(0), idx, idx.stride(0), idx.shape[1], 640, 1,
            case.scale * 1.4426950408889634, case.sink, out, out.stride(0), out.stride(1), out, out,
            BLOCK_N=32, STAGES=4, PW=4, REGS=232, PRODUCER_REGS=40, PDL=0, num_warps=4, launch_pdl=True)
        torch.cuda.synchronize()
        bad += not torch.equal(out, want)
    if not bad:
        pytest.skip("no overlap seen: the launch after _late_copy_kernel waited for it")


@triton.jit
def _decode_kernel(ptr, out_ptr, row_bytes, D, FMT: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
                   ASM: tl.constexpr):
    r = tl.arange(0, ROWS)
    x = decode_rows(ptr, r.to(tl.int64) * row_bytes, r >= 0, 0, D, FMT, BLOCK_C, tl.bfloat16, ASM)
    tl.store(out_ptr + r[:, None] * BLOCK_C + tl.arange(0, BLOCK_C)[None, :], x)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_packed_cache_decode_is_exact(fmt):
    """The packed PTX decodes give the float path's bits for every code and a range of scales (E4M3
    subnormal elements and NVFP4 scales included)."""
    rows, dim = 64, 512
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 256, (rows, dim // 2 if fmt == "nvfp4" else dim), generator=g, dtype=torch.uint8)
    if fmt == "fp8":
        codes[:, :256] = torch.arange(256, dtype=torch.uint8)  # every E4M3 byte, NaN (0x7F, 0xFF) aside
        codes[(codes & 0x7F) == 0x7F] = 0x7E
        scales = torch.randint(90, 160, (rows, dim // 32), generator=g, dtype=torch.uint8)
    else:
        scales = torch.randint(1, 127, (rows, dim // 16), generator=g, dtype=torch.uint8)  # positive E4M3
        scales[0, :7] = torch.arange(1, 8, dtype=torch.uint8)  # subnormal scales
    data = torch.cat((codes, scales), dim=1).cuda()
    out = {}
    for asm in (False, True):
        out[asm] = torch.empty(rows, dim, dtype=torch.bfloat16, device="cuda")
        _decode_kernel[(1,)](data, out[asm], data.shape[1], dim, FMT=FORMATS[fmt], ROWS=rows, BLOCK_C=dim,
                             ASM=asm, num_warps=8)
    assert torch.equal(out[True].view(torch.int16), out[False].view(torch.int16))


@pytest.mark.parametrize("fmt", [("fp8", "nvfp4"), ("raw", "raw")])
def test_invariant_paged_attention_is_bitwise_in_batches(fmt):
    """Batch-invariant mode at Flash width: probe row 0 (a 5-key window with its own key, 512 entries)
    gives the same bits alone (index arrays cut to its keys) and in batches of 3, 17, 64 (3 of them
    padding rows) and 200 rows, at other positions and with wider arrays. On an H200 the 200 rows fold
    their splits in their own programs, the smaller batches use a program per split."""
    args, kwargs = _paged_inputs(200, fmt, seed=11)
    q, kv, ring, codec, window, _, _, sink, scale = args
    ring_rows = ring.shape[0] * ring.shape[1]
    window = torch.where(window >= ring_rows, -1, window)  # ring keys, then each row's own key first
    none = torch.zeros(0, dtype=torch.long, device="cuda")

    def run(rows: list[int], pad_rows: int = 0, wider: int = 0) -> torch.Tensor:
        sel = torch.tensor(rows, device="cuda")
        win, topk = window[sel], kwargs["topk"][sel]
        win[:, 0] = ring_rows + torch.arange(len(rows), device="cuda")
        if len(rows) == 1:  # alone: the arrays cut to the probe's keys
            win, topk = win[:, :5], topk[:, : int((topk[0] >= 0).nonzero().max()) + 1]
        win = torch.nn.functional.pad(win, (0, wider, 0, pad_rows), value=-1)
        topk = torch.nn.functional.pad(topk, (0, wider, 0, pad_rows), value=-1)
        rows_q = torch.cat([q[sel], q[:pad_rows]])
        rows_kv = torch.cat([kv[sel], kv[:pad_rows]])
        seg = torch.cat([kwargs["row_seg"][sel], kwargs["row_seg"][:pad_rows]])
        return sparse_attention_paged(
            rows_q, rows_kv, ring.clone(), codec, win, none, none, sink, scale, pool=kwargs["pool"],
            pool_codec=kwargs["pool_codec"], topk=topk, block_tables=kwargs["block_tables"], row_seg=seg,
            batch_invariant=True)

    alone = run([0])[0]
    assert (window[0, 5:] < 0).all() and alone.isfinite().all()
    for rows, pad_rows, wider in (([50, 0], 1, 0), ([*range(1, 10), 0, *range(10, 17)], 0, 70),
                                  ([*range(100, 140), 0, *range(140, 160)], 3, 150), ([*range(200)], 0, 0)):
        got = run(rows, pad_rows, wider)
        assert torch.equal(got[rows.index(0)], alone), (len(rows), pad_rows, wider)
