"""Batch-invariant MoE (`moe(..., batch_invariant=True)`): a token's output is
bitwise the same alone and in any batch, and the invariant path still matches the reference.

The bitwise check runs at Flash widths (384 experts, top-6, H 5120, I 2304), where the default path
switches between the decode GEMVs, the tuned grouped-GEMM configs and the split-K linears with the batch
size; half of the probe's companions are near copies of it, so its experts' tiles hold other tokens. The
invariant mode's own tile changes with the batch (`moe.invariant_tiles`) are each checked bitwise against
INVARIANT_CONFIG on the same inputs.
Conformance: the same tolerances as test_linear_moe_cuda.py (only summation order differs).
"""

import dataclasses
import math

import pytest
import torch

from deepinfer.checkpoint.formats import E2M1_VALUES, quantize_fp4, quantize_fp8
from deepinfer.ops.weights import MoEWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape and got.dtype == want.dtype and torch.isfinite(got).all()
    return float((got.double() - want.double()).norm() / want.double().norm())


def _random_fp4(n: int, rows: int, cols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random packed E2M1 bytes, one power-of-two scale giving unit-variance products."""
    data = torch.randint(0, 256, (n, rows, cols // 2), dtype=torch.uint8, device="cuda", generator=gen)
    rms = math.sqrt(sum(v * v for v in E2M1_VALUES) / len(E2M1_VALUES))
    byte = 127 + round(math.log2(1 / (rms * math.sqrt(cols))))
    return data, torch.full((n, rows, cols // 32), byte, dtype=torch.uint8, device="cuda")


def _layer(ops, n_experts: int, hidden: int, inter: int, topk: int, dtype: torch.dtype, seed: int,
           quantized: bool) -> MoEWeights:
    """`quantized`: experts quantised from Gaussian weights (small shapes), else random FP4 bytes."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if quantized:
        def experts(rows, cols):
            q = [quantize_fp4(torch.randn(rows, cols, device="cuda", generator=gen) * 0.05)
                 for _ in range(n_experts)]
            return torch.stack([w for w, _ in q]), torch.stack([s for _, s in q])
    else:
        def experts(rows, cols):
            return _random_fp4(n_experts, rows, cols, gen)
    w1, w3, w2 = experts(inter, hidden), experts(inter, hidden), experts(hidden, inter)
    shared = [quantize_fp8(torch.randn(*shape, device="cuda", generator=gen) / math.sqrt(shape[1]))
              for shape in ((inter, hidden), (inter, hidden), (hidden, inter))]
    return MoEWeights(
        gate=(torch.randn(n_experts, hidden, device="cuda", generator=gen) / math.sqrt(hidden)).bfloat16(),
        bias=torch.randn(n_experts, device="cuda", generator=gen) * 0.1,
        bias_vl=torch.randn(n_experts, device="cuda", generator=gen) * 0.1,
        experts=ops.prepare_experts(*w1, *w3, *w2),
        shared_w1=ops.prepare_linear("fp8", *shared[0]),
        shared_w3=ops.prepare_linear("fp8", *shared[1]),
        shared_w2=ops.prepare_linear("fp8", *shared[2]),
        topk=topk, route_scale=2.5, swiglu_limit=10.0, dtype=dtype,
    )


@pytest.fixture(scope="module")
def flash_layer(cuda_ops) -> MoEWeights:
    return _layer(cuda_ops, 384, 5120, 2304, 6, torch.bfloat16, seed=0, quantized=False)


@pytest.mark.parametrize("images", [False, True])
def test_token_output_is_bitwise_independent_of_its_batch(flash_layer, images):
    from deepinfer_kernels_cuda import moe

    gen = torch.Generator(device="cuda").manual_seed(1)
    h = 5120
    probe = torch.randn(1, h, device="cuda", generator=gen).bfloat16()
    probe_mask = torch.tensor([images], device="cuda")
    alone = moe.moe(probe, flash_layer, probe_mask, batch_invariant=True)
    assert torch.isfinite(alone).all()
    # 2048 / 4096 tokens: the 64-token prefill tiles (`moe.invariant_tiles`), the shared expert's too
    for size, pos in ((3, 1), (17, 9), (64, 50), (257, 200), (2048, 1000), (4096, 3001)):
        others = torch.randn(size, h, device="cuda", generator=gen)
        near = torch.arange(size, device="cuda") % 2 == 0  # near copies: they meet the probe's experts
        batch = torch.where(near[:, None], probe.float() + 0.05 * others, others).bfloat16()
        batch[pos] = probe[0]
        mask = torch.rand(size, device="cuda", generator=gen) < 0.5
        mask[pos] = images
        out = moe.moe(batch, flash_layer, mask, batch_invariant=True)
        diff = float((out[pos].float() - alone[0].float()).abs().max())
        assert torch.equal(out[pos], alone[0]), (size, diff)


@pytest.mark.parametrize("tokens", [1, 5, 64, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fp8_experts", [False, True])
def test_invariant_path_matches_reference(cuda_ops, ref_ops, poison, tokens, dtype, fp8_experts):
    from deepinfer_kernels_cuda import moe

    ours = _layer(cuda_ops, 32, 256, 128, 4, dtype, seed=tokens, quantized=True)
    ref = _layer(ref_ops, 32, 256, 128, 4, dtype, seed=tokens, quantized=True)
    if fp8_experts:
        r = ref.experts
        ours = dataclasses.replace(
            ours, experts=moe.prepare_experts(r.w1, r.w1_scale, r.w3, r.w3_scale, r.w2, r.w2_scale, fp8=True))
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 256, device="cuda", generator=gen).to(dtype)
    mask = torch.rand(tokens, device="cuda", generator=gen) < 0.5
    got = moe.moe(x, ours, mask, batch_invariant=True)
    assert _rel_err(got, ref_ops.moe(x, ref, mask)) <= TOL[dtype]


def test_invariant_router_logits_match_reference():
    from deepinfer_kernels_cuda import moe

    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(37, 5120, device="cuda", generator=gen).bfloat16()
    gate = (torch.randn(384, 5120, device="cuda", generator=gen) / 70).bfloat16()
    got = moe.router_logits(x, gate, batch_invariant=True)
    want = x.float() @ gate.float().T
    assert _rel_err(got, want) <= 2e-5  # float32 summation order over 5120 exact products
    assert torch.equal(moe.router_logits(x[5:6], gate, batch_invariant=True)[0], got[5])


def test_invariant_mode_needs_fp8_shared_expert(cuda_ops):
    from deepinfer_kernels_cuda import moe

    layer = _layer(cuda_ops, 8, 64, 64, 2, torch.bfloat16, seed=3, quantized=True)
    dense = cuda_ops.prepare_linear("dense", torch.randn(64, 64, device="cuda").bfloat16(), None)
    layer = dataclasses.replace(layer, shared_w2=dense)
    with pytest.raises(ValueError, match="shared expert"):
        moe.moe(torch.randn(2, 64, device="cuda").bfloat16(), layer, batch_invariant=True)


def _prefill_inputs(n_experts: int, tokens: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, 5120, device="cuda", generator=gen).bfloat16()
    ids = [torch.randperm(n_experts, device="cuda", generator=gen)[:6] for _ in range(tokens)]
    return x, torch.rand(tokens, 6, device="cuda", generator=gen), torch.stack(ids).int()


@pytest.mark.parametrize("fp8_experts", [False, True])
def test_invariant_prefill_tiles_keep_the_bits(fp8_experts):
    """Every tile the invariant mode takes past INVARIANT_CONFIG's sizes, and its variants (pointer
    kernels, another down tile, K steps of E4M3 experts), gives bitwise INVARIANT_CONFIG's expert outputs
    (the same MMA chain per output). All run before the assertion: a failure names every tile that broke."""
    from dataclasses import replace

    from deepinfer_kernels_cuda import moe
    from deepinfer_kernels_cuda.configs import TileConfig

    gen = torch.Generator(device="cuda").manual_seed(3)
    experts = moe.prepare_experts(*_random_fp4(64, 2304, 5120, gen), *_random_fp4(64, 2304, 5120, gen),
                                  *_random_fp4(64, 5120, 2304, gen), fp8=fp8_experts)
    x, weights, ids = _prefill_inputs(64, 2048, seed=4)  # 64 experts: 192 assignments each
    want = moe.routed_experts(x, weights, ids, experts, 10.0, moe.INVARIANT_CONFIG)
    up, down = moe.invariant_tiles(x, ids.numel(), 64, not fp8_experts, 5120, 2304)
    assert (up, down) != (moe.INVARIANT_CONFIG, moe.INVARIANT_CONFIG)
    if fp8_experts:
        variants = {f"{bm} tokens": tiles for bm, tiles in moe.INVARIANT_FP8.items()}
        variants["K steps 64 / 128"] = (replace(up, block_k=64), replace(down, block_k=128))
    else:
        variants = {"taken": (up, down), "pointer kernels": moe._INVARIANT_FP4_POINTERS,
                    "down 128 rows": (up, TileConfig(128, 64, 128, 1, 8, 3, tma=3)),
                    "down by pointers": (up, replace(down, tma=1)), "32 tokens": moe._INVARIANT_FP4[32]}
    broke = [name for name, (u, d) in variants.items()
             if not torch.equal(moe.routed_experts(x, weights, ids, experts, 10.0, u, d), want)]
    assert not broke, broke


def test_invariant_shared_expert_tiles_keep_the_bits(flash_layer):
    """The FP8 shared expert (a one-expert MLP through the grouped kernels) at each of its invariant tiles
    and at INVARIANT_CONFIG: bitwise; and `_shared_expert_invariant` takes the 64-token tiles at 2048."""
    from deepinfer_kernels_cuda import moe

    x, _, _ = _prefill_inputs(64, 2048, seed=5)
    w1, w3, w2 = flash_layer.shared_w1, flash_layer.shared_w3, flash_layer.shared_w2
    mlp = moe._Mlp(w1.weight, w1.scale, w3.weight, w3.scale, w2.weight, w2.scale, True, 32, False)
    ones = torch.ones((len(x), 1), dtype=torch.float32, device="cuda")
    zeros = torch.zeros((len(x), 1), dtype=torch.int32, device="cuda")

    def run(up, down):
        return moe._grouped_mlp(x, ones, zeros, mlp, 1, 2304, 10.0, up, down_cfg=down)

    want = run(moe.INVARIANT_CONFIG, moe.INVARIANT_CONFIG)
    assert moe.invariant_tiles(x, len(x), 1, False, 5120, 2304) == moe.INVARIANT_FP8[64]
    broke = [bm for bm, tiles in moe.INVARIANT_FP8.items() if not torch.equal(run(*tiles), want)]
    assert not broke, broke
    assert torch.equal(moe._shared_expert_invariant(x, flash_layer), want)

