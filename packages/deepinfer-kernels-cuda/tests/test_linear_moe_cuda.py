"""The block-scaled linear and MoE kernels against the reference ops on the same weights.

Tolerances: the kernels decode weights exactly and round at the reference's points, so the only
difference is float32 summation order (plus, for bf16, a one-ulp flip where that order changes a
rounding). Judged by relative Frobenius error: <= 1e-2 in bf16 (typically ~2e-3), <= 1e-5 in float32.
"""

import dataclasses

import pytest
import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.ops.weights import MoEWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.isfinite(got).all()
    return float((got.double() - want.double()).norm() / want.double().norm())


def _weight(kind: str, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = torch.randn(rows, cols, device="cuda") * 0.05
    if kind == "fp8":
        return quantize_fp8(w)
    if kind == "fp4":
        return quantize_fp4(w)
    return w.bfloat16(), None


@pytest.mark.parametrize("kind", ["fp8", "fp4", "dense"])
@pytest.mark.parametrize("m", [1, 3, 8, 64, 300, 600])  # GEMV, tiled, decode-once + cuBLAS (>= DEQUANT_M)
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_linear_matches_reference(cuda_ops, ref_ops, poison, kind, m, groups, out_dtype):
    torch.manual_seed(m * 7 + groups)
    n, k = 512, 384  # grouped: input chunk g (k / groups columns) feeds output rows block g
    weight, scale = _weight(kind, n, k // groups)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    got = cuda_ops.linear(x, cuda_ops.prepare_linear(kind, weight, scale, groups), out_dtype)
    want = ref_ops.linear(x, ref_ops.prepare_linear(kind, weight, scale, groups), out_dtype)
    assert _rel_err(got, want) <= TOL[out_dtype]


@pytest.mark.parametrize(
    ("m", "block_n", "block_k", "split", "warps", "stages"),
    [(1, 8, 1024, 1, 4, 1), (1, 4, 1024, 4, 4, 2), (1, 32, 256, 2, 1, 1), (2, 16, 512, 1, 2, 2),
     (4, 4, 1024, 3, 4, 1), (3, 8, 2048, 1, 8, 2),
     # 1-2 rows per program, several chunks per thread per step, steps wider than K (masked chunks)
     (1, 1, 8192, 1, 4, 1), (1, 2, 4096, 1, 4, 2), (1, 1, 2048, 2, 2, 2), (8, 2, 1024, 1, 4, 2),
     # cp.async pipeline (num_stages >= 3) over 3 and 5 steps
     (1, 8, 512, 1, 4, 3), (1, 2, 256, 1, 4, 4), (4, 4, 512, 1, 4, 3)],
)
def test_gemv_configs_match_reference(ref_ops, poison, m, block_n, block_k, split, warps, stages):
    """The FP8 GEMV at configs tune.py sweeps: ragged last K steps (1280 = 1024 + 256), split K, groups,
    register prefetch and the cp.async pipeline, scale rows read as 32-bit words (40 bytes each)."""
    from deepinfer_kernels_cuda import configs, linear

    torch.manual_seed(m)
    weight, scale = _weight("fp8", 8 * 64, 1280)
    x = torch.randn(m, 8 * 1280, device="cuda", dtype=torch.bfloat16)
    cfg = configs.TileConfig(block_n, m, block_k, split, warps, stages)  # stages 2: one step prefetched
    got = linear.gemv_linear(x, linear.prepare_linear("fp8", weight, scale, 8), torch.float32, cfg)
    want = ref_ops.linear(x, ref_ops.prepare_linear("fp8", weight, scale, 8), torch.float32)
    assert _rel_err(got, want) <= TOL[torch.float32]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="TMA needs sm_90")
@pytest.mark.parametrize(
    ("n", "k", "groups", "block_n", "block_k", "stages", "per_sm", "pdl", "f32"),
    [(36864, 1280, 1, 32, 256, 4, 2, 0, 0), (36864, 1280, 1, 16, 256, 4, 4, 1, 0),
     (5120, 8192, 1, 8, 1024, 4, 2, 0, 0), (5120, 8192, 1, 4, 2048, 4, 2, 1, 0),
     (8192, 4096, 8, 16, 512, 4, 2, 1, 0), (8192, 4096, 8, 32, 256, 4, 2, 0, 0),
     (1792, 5120, 1, 8, 1024, 4, 2, 0, 0), (1024, 1280, 8, 8, 512, 3, 1, 0, 1)],  # last: blocks < SMs
)
def test_gemv_tma_matches_reference(ref_ops, poison, n, k, groups, block_n, block_k, stages, per_sm, pdl,
                                    f32):
    """The persistent TMA GEMV (a GEMV config with tma set, one token) at Flash shapes and configs that
    `linear.py --tma` times (q_b+indexer, o_b, grouped o_a, q_a+kv), under PDL too; with float32 out, 3
    tokens at the same config run the register GEMV."""
    from deepinfer_kernels_cuda import configs, linear

    torch.manual_seed(n + k)
    weight, scale = _weight("fp8", n, k)
    ours = linear.prepare_linear("fp8", weight, scale, groups)
    ref = ref_ops.prepare_linear("fp8", weight, scale, groups)
    cfg = configs.TileConfig(block_n, 1, block_k, per_sm, 4, stages, tma=1, pdl=pdl)
    out_dtype = torch.float32 if f32 else torch.bfloat16
    for m in (1, 3) if f32 else (1,):
        x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
        got = linear.gemv_linear(x, ours, out_dtype, cfg)
        assert _rel_err(got, ref_ops.linear(x, ref, out_dtype)) <= TOL[out_dtype]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs sm_90")
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_gemv_pdl_equals_plain_launch(stages):
    """GEMVs under programmatic dependent launch, captured back to back in a CUDA graph (each may start
    while the one before drains; the second reads the first's output) give the plain launches' bits."""
    from deepinfer_kernels_cuda import configs, linear

    torch.manual_seed(stages)
    w1, s1 = _weight("fp8", 2048, 1280)
    w2, s2 = _weight("fp8", 1280, 2048)
    first, second = linear.prepare_linear("fp8", w1, s1), linear.prepare_linear("fp8", w2, s2)
    x = torch.randn(1, 1280, device="cuda", dtype=torch.bfloat16)
    plain = [configs.TileConfig(8, 1, 256, 1, 4, stages), configs.TileConfig(4, 1, 1024, 1, 4, stages)]

    def chain(cfgs):
        return linear.block_linear(linear.block_linear(x, first, torch.bfloat16, cfgs[0]), second,
                                   torch.float32, cfgs[1])

    want = chain(plain)
    pdl = [dataclasses.replace(c, pdl=1) for c in plain]
    assert torch.equal(chain(pdl), want)  # eager launches too
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(pdl)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["fp8", "fp4"])
def test_dequantize_is_exact(ref_ops, kind):
    from deepinfer_kernels_cuda import dequant

    weight, scale = _weight(kind, 96, 320)
    want = ref_ops.prepare_linear(kind, weight, scale).dequantized(torch.bfloat16)
    got = dequant.dequantize(kind, weight.view(torch.uint8) if kind == "fp4" else weight,
                             scale.view(torch.uint8), 96, 320, torch.bfloat16)
    assert torch.equal(got, want)


def test_backend_provides_the_linear_moe_group(cuda_ops):
    assert not {"prepare_linear", "linear", "prepare_experts", "moe"} & set(cuda_ops.fallbacks)


def test_linear_rejects_bad_input(cuda_ops):
    weight, scale = _weight("fp8", 64, 64)
    with pytest.raises(ValueError, match="scale"):
        cuda_ops.prepare_linear("fp8", weight, scale[:1])
    prepared = cuda_ops.prepare_linear("fp8", weight, scale)
    with pytest.raises(ValueError, match="input width"):
        cuda_ops.linear(torch.randn(2, 32, device="cuda"), prepared, torch.bfloat16)


def _moe_layers(ours_ops, ref_ops, n_experts: int, hidden: int, inter: int, topk: int, dtype: torch.dtype):
    def experts(rows, cols):
        q = [quantize_fp4(torch.randn(rows, cols, device="cuda") * 0.05) for _ in range(n_experts)]
        return torch.stack([w for w, _ in q]), torch.stack([s for _, s in q])

    w1, w3, w2 = experts(inter, hidden), experts(inter, hidden), experts(hidden, inter)
    shared = [_weight("fp8", *shape) for shape in ((inter, hidden), (inter, hidden), (hidden, inter))]
    common = dict(
        gate=(torch.randn(n_experts, hidden, device="cuda") * 0.05).bfloat16(),
        bias=torch.randn(n_experts, device="cuda") * 0.1,
        bias_vl=torch.randn(n_experts, device="cuda") * 0.1,
        topk=topk, route_scale=2.5, swiglu_limit=10.0, dtype=dtype,
    )

    def build(prepare_experts, prepare_linear):
        return MoEWeights(
            experts=prepare_experts(*w1, *w3, *w2),
            shared_w1=prepare_linear("fp8", *shared[0]),
            shared_w3=prepare_linear("fp8", *shared[1]),
            shared_w2=prepare_linear("fp8", *shared[2]),
            **common,
        )

    return tuple(build(ops.prepare_experts, ops.prepare_linear) for ops in (ours_ops, ref_ops))


@pytest.mark.parametrize("tokens", [1, 5, 64, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("images", [False, True])
def test_moe_matches_reference(cuda_ops, ref_ops, poison, tokens, dtype, images):
    torch.manual_seed(tokens)
    # 32 experts, top-4: at 1 and 5 tokens most experts receive no token
    ours, ref = _moe_layers(cuda_ops, ref_ops, 32, 256, 128, 4, dtype)
    x = torch.randn(tokens, 256, device="cuda", dtype=dtype)
    mask = torch.rand(tokens, device="cuda") < 0.5 if images else None
    got = cuda_ops.moe(x, ours, mask)
    want = ref_ops.moe(x, ref, mask)
    assert _rel_err(got, want) <= TOL[dtype]


@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_moe_fp8_experts_match_reference(cuda_ops, ref_ops, poison, tokens):
    from deepinfer_kernels_cuda import moe

    torch.manual_seed(tokens)
    ours, ref = _moe_layers(cuda_ops, ref_ops, 32, 256, 128, 4, torch.bfloat16)
    r = ref.experts
    ours = dataclasses.replace(
        ours, experts=moe.prepare_experts(r.w1, r.w1_scale, r.w3, r.w3_scale, r.w2, r.w2_scale, fp8=True)
    )
    x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
    assert _rel_err(cuda_ops.moe(x, ours), ref_ops.moe(x, ref)) <= TOL[torch.bfloat16]


def _random_experts(n_experts: int, hidden: int, inter: int, scale_lo: int, scale_hi: int):
    """Stacked packed FP4 experts of uniformly random bytes (every code) with scale bytes in
    [scale_lo, scale_hi]: (w1, s1, w3, s3, w2, s2) as the release stores them."""
    def fp4(rows, cols):
        w = torch.randint(0, 256, (n_experts, rows, cols // 2), dtype=torch.uint8, device="cuda")
        s = torch.randint(scale_lo, scale_hi + 1, (n_experts, rows, cols // 32), dtype=torch.uint8,
                          device="cuda")
        return w, s.view(torch.float8_e8m0fnu)

    return (*fp4(inter, hidden), *fp4(inter, hidden), *fp4(hidden, inter))


@pytest.mark.parametrize("tokens", [1, 5, 64, 300])
def test_moe_packed_decode_equals_integer_decode(tokens):
    """The packed PTX decode (`asm`) and the Triton integer decode give the same BF16 weights, so the MMA
    kernels' outputs are bitwise equal and the GEMVs' equal up to float32 summation order; every code
    (code 1 passes the BF16 subnormal 2^-127 before the scale multiply), scale bytes 100 to
    ASM_MAX_SCALE (scale 2)."""
    from deepinfer_kernels_cuda import configs, moe
    from deepinfer_kernels_cuda.dequant import ASM_MAX_SCALE

    torch.manual_seed(tokens)
    e, h, i, k = 16, 512, 256, 4
    w = _random_experts(e, h, i, 100, ASM_MAX_SCALE)
    fast = moe.prepare_experts(*w)
    assert fast.asm
    slow = dataclasses.replace(fast, asm=False)
    x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
    weights = torch.rand(tokens, k, device="cuda")
    ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(tokens)]).int()
    for cfg in (configs.TileConfig(64, 16, 128, 1, 4, 4), configs.TileConfig(128, 64, 64, 1, 8, 3)):
        got, want = (moe.routed_experts(x, weights, ids, p, 10.0, cfg) for p in (fast, slow))
        assert torch.equal(got, want), cfg
    if tokens * k <= moe.DECODE_ASSIGNMENTS:
        got, want = (moe.routed_experts_decode(x, weights, ids, p, 10.0) for p in (fast, slow))
        assert _rel_err(got, want) <= 2e-3  # one-ulp BF16 flips of the intermediate activations at most
        mlp = [moe._Mlp(p.w1, p.s1, p.w3, p.s3, p.w2, p.s2, False, 1, True, p.asm) for p in (fast, slow)]
        cfg = configs.TileConfig(64, 16, 128, 1, 4, 4)
        got, want = (moe._grouped_mlp(x, weights, ids, m, e, i, 10.0, cfg, direct=True) for m in mlp)
        assert torch.equal(got, want)
        assert torch.equal(got, moe.routed_experts(x, weights, ids, slow, 10.0, cfg))  # aligned blocks


def test_packed_decode_is_chosen_only_where_exact():
    from deepinfer_kernels_cuda import moe

    w = list(_random_experts(2, 64, 64, 120, 129))  # a scale byte above ASM_MAX_SCALE
    assert not moe.prepare_experts(*w).asm
    with pytest.raises(ValueError, match="scale bytes"):
        moe.prepare_experts(*w, asm=True)
    assert not moe.prepare_experts(*(t.cpu() for t in w)).asm


@pytest.mark.parametrize("tokens", [1, 5, 10])
def test_moe_decode_paths_match_reference(cuda_ops, ref_ops, monkeypatch, tokens):
    """Both unfused decode paths (GEMVs; MMA kernels with one block per assignment) against the reference."""
    from deepinfer_kernels_cuda import configs, moe

    monkeypatch.setattr(moe, "DECODE_DOWN_OVERRIDE", False)  # not the fused path the H200 table selects
    torch.manual_seed(tokens)
    ours, ref = _moe_layers(cuda_ops, ref_ops, 32, 256, 128, 4, torch.bfloat16)
    x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
    want = ref_ops.moe(x, ref)
    for path in (configs.TileConfig(16, 1, 256, 1, 4, 3), configs.TileConfig(8, 1, 512, 1, 4, 2),
                 configs.TileConfig(64, 16, 128, 1, 4, 4), configs.TileConfig(32, 16, 256, 1, 4, 3)):
        monkeypatch.setattr(moe, "DECODE_OVERRIDE", path)
        assert _rel_err(cuda_ops.moe(x, ours), want) <= TOL[torch.bfloat16], path


@pytest.mark.parametrize("tokens", [1, 5, 10])
def test_moe_fused_decode_matches_reference(cuda_ops, ref_ops, poison, monkeypatch, tokens):
    """The fused decode path (routing and the shared expert in the routed gate+up launch, combine in the
    down launch) at CUDA-core and MMA tiles, and mixed, against the reference; it must not fall back to
    the unfused one."""
    from deepinfer_kernels_cuda import configs, moe

    torch.manual_seed(tokens)
    ours, ref = _moe_layers(cuda_ops, ref_ops, 32, 256, 128, 4, torch.bfloat16)
    x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
    mask = torch.rand(tokens, device="cuda") < 0.5  # image rows: bias_vl in the in-kernel routing
    want = ref_ops.moe(x, ref, mask)
    gemv, mma = configs.TileConfig(16, 1, 256, 1, 4, 3), configs.TileConfig(64, 16, 128, 1, 4, 4)
    def split(c: configs.TileConfig) -> configs.TileConfig:
        return dataclasses.replace(c, split_k=5)

    for up, down in ((gemv, gemv), (mma, mma), (configs.TileConfig(32, 16, 256, 1, 4, 3), gemv),
                     (configs.TileConfig(8, 1, 512, 1, 4, 2), configs.TileConfig(16, 16, 128, 1, 4, 3)),
                     (mma, split(mma)), (gemv, split(gemv))):  # down: a program per slot, last combines
        monkeypatch.setattr(moe, "DECODE_OVERRIDE", up)
        monkeypatch.setattr(moe, "DECODE_DOWN_OVERRIDE", down)
        assert moe._fused_decode_tiles(tokens, ours) == (up, down)
        got = cuda_ops.moe(x, ours, mask)
        assert _rel_err(got, want) <= TOL[torch.bfloat16], (up, down)
        if down.split_k > 1:  # a program per slot, the last to arrive combines: the per-token sum, bitwise
            monkeypatch.setattr(moe, "DECODE_DOWN_OVERRIDE", dataclasses.replace(down, split_k=1))
            assert torch.equal(got, cuda_ops.moe(x, ours, mask)), down
    # gate and up rows stacked in one MMA tile: 8 warps (a warpgroup per projection) sum each row as 4 do
    monkeypatch.setattr(moe, "DECODE_DOWN_OVERRIDE", split(mma))
    outs = []
    for warps, maxnreg in ((4, 0), (8, 128)):
        monkeypatch.setattr(moe, "DECODE_OVERRIDE", configs.TileConfig(64, 16, 256, 1, warps, 3, maxnreg))
        outs.append(cuda_ops.moe(x, ours, mask))
    assert torch.equal(*outs)


@pytest.mark.parametrize("tokens", [1, 3, 10])
def test_router_gemv_matches_float32_product(monkeypatch, tokens):
    from deepinfer_kernels_cuda import moe

    monkeypatch.setattr(moe, "ROUTER_GEMV_TOKENS", 10)
    x = torch.randn(tokens, 5120, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(384, 5120, device="cuda", dtype=torch.bfloat16)
    want = x.double() @ gate.double().T
    assert torch.allclose(moe.router_logits(x, gate).double(), want, rtol=1e-5, atol=1e-3)


def test_route_matches_reference(cuda_ops, ref_ops):
    from deepinfer.ops.reference import moe as ref_moe
    from deepinfer_kernels_cuda import moe

    torch.manual_seed(1)
    ours, ref = _moe_layers(cuda_ops, ref_ops, 384, 64, 32, 6, torch.bfloat16)
    x = torch.randn(257, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.rand(257, device="cuda") < 0.3
    want_w, want_ids = ref_moe.route(x, ref, mask)
    got_w, got_ids = moe.route(moe.router_logits(x, ours.gate), ours.bias, ours.bias_vl, mask, 6, 2.5)
    same = (got_ids.long() == want_ids).all(-1)
    assert same.float().mean() > 0.99  # a near-tie may flip under a different logit summation order
    torch.testing.assert_close(got_w[same], want_w[same], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("tokens", "topk", "experts", "block_m"), [(1, 6, 384, 16), (10, 6, 384, 16), (7, 4, 20, 32)]
)
def test_align_one_program_equals_torch_path(monkeypatch, tokens, topk, experts, block_m):
    from deepinfer_kernels_cuda import moe

    torch.manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts)[:topk] for _ in range(tokens)]).int().cuda()
    small = moe.align(ids, experts, block_m)
    monkeypatch.setattr(moe, "SMALL_ALIGN", 0)
    big = moe.align(ids, experts, block_m)
    assert torch.equal(small.row_assign, big.row_assign) and torch.equal(small.block_expert, big.block_expert)


def test_align_pads_each_expert_and_keeps_every_assignment():
    from deepinfer_kernels_cuda import moe

    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], device="cuda")
    al = moe.align(ids, n_experts=5, block_m=4)
    rows = al.row_assign.view(-1, 4)
    assert al.blocks == rows.shape[0]
    for b in range(al.blocks):
        e = int(al.block_expert[b])
        assigned = rows[b][rows[b] >= 0]
        if e < 0:
            assert assigned.numel() == 0
        else:
            assert (ids.flatten()[assigned.long()] == e).all()
    assert sorted(al.row_assign[al.row_assign >= 0].tolist()) == list(range(6))
