"""Prepared-weight ops of the reference backend (linear, MoE) and the registry's op groups."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from deepinfer.checkpoint.formats import dequantize_fp4, quantize_fp4, quantize_fp8
from deepinfer.ops import Backend, BackendError, get_ops
from deepinfer.ops import registry as ops_registry
from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.ops.reference import moe as reference_moe
from deepinfer.ops.reference.linear import linear, prepare_linear
from deepinfer.ops.reference.moe import (
    moe,
    prepare_experts,
    route,
    routed_experts,
    swiglu_clamped,
)
from deepinfer.ops.weights import MoEWeights

LIMIT = 7.0


def _experts(g: torch.Generator, e: int, h: int, i: int):
    parts = {}
    for name, (r, c) in {"w1": (i, h), "w3": (i, h), "w2": (h, i)}.items():
        q = [quantize_fp4(torch.randn(r, c, generator=g) * 0.2) for _ in range(e)]
        parts[name], parts[f"{name}_scale"] = torch.stack([w for w, _ in q]), torch.stack([s for _, s in q])
    return prepare_experts(**parts)


def _layer(g: torch.Generator, e: int = 8, h: int = 64, i: int = 32, topk: int = 3, dtype=torch.float32):
    shared = [prepare_linear("fp8", *quantize_fp8(torch.randn(r, c, generator=g) * 0.1))
              for r, c in ((i, h), (i, h), (h, i))]
    return MoEWeights(
        gate=torch.randn(e, h, generator=g).bfloat16(),
        bias=torch.randn(e, generator=g) * 0.1,
        bias_vl=torch.randn(e, generator=g) * 0.1,
        experts=_experts(g, e, h, i),
        shared_w1=shared[0],
        shared_w3=shared[1],
        shared_w2=shared[2],
        topk=topk,
        route_scale=1.5,
        swiglu_limit=LIMIT,
        dtype=dtype,
    )


def _per_expert_loop(x, weights, ids, ex) -> torch.Tensor:
    """The pre-stacking algorithm: each distinct expert on its tokens, index_add in expert order."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        w1, w3, w2 = (dequantize_fp4(getattr(ex, n)[e], getattr(ex, f"{n}_scale")[e], dtype=x.dtype)
                      for n in ("w1", "w3", "w2"))
        act = swiglu_clamped(F.linear(x[tok], w1), F.linear(x[tok], w3), LIMIT) * weights[tok, slot, None]
        out.index_add_(0, tok, F.linear(act.to(x.dtype), w2).float())
    return out.to(x.dtype)


# batched products may block their sums differently from per-expert ones: float32 rounding apart
F32_TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_routed_experts_equal_the_per_expert_loop(tokens, dtype):
    g = torch.Generator().manual_seed(tokens)
    layer = _layer(g, dtype=dtype)
    x = (torch.randn(tokens, 64, generator=g) * 2).to(dtype)
    weights, ids = route(x, layer, None)
    want = _per_expert_loop(x, weights, ids, layer.experts)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else F32_TOL
    torch.testing.assert_close(routed_experts(x, weights, ids, layer.experts, LIMIT), want, **tol)


@pytest.mark.parametrize("path", ["grouped", "padded"])
def test_experts_without_tokens_and_ragged_groups(path, monkeypatch):
    if path == "padded":  # the accelerator path, run on CPU
        padded = partial(reference_moe._padded_products, capacity=20)
        monkeypatch.setattr(reference_moe, "_grouped_products", padded)
    g = torch.Generator().manual_seed(9)
    layer = _layer(g, e=48, topk=2)
    x = torch.randn(20, 64, generator=g)
    # expert 0 on every token (a group at full capacity), 47 and 3 twice, 16 experts once, 29 unused;
    # 40 pairs: 40 experts dequantised (19 selected, 21 padding) in three chunks, selected ones in two
    others = torch.tensor([47, 3, 47, 17, 3, *range(20, 35)])
    ids = torch.stack((torch.zeros_like(others), others), dim=1)
    weights = torch.rand(20, 2, generator=g)
    want = _per_expert_loop(x, weights, ids, layer.experts)
    torch.testing.assert_close(routed_experts(x, weights, ids, layer.experts, LIMIT), want, **F32_TOL)


def test_moe_adds_the_shared_expert_and_routes_image_rows_with_bias_vl():
    g = torch.Generator().manual_seed(2)
    layer = _layer(g)
    x = torch.randn(6, 64, generator=g)
    image = torch.tensor([True, False] * 3)
    weights, ids = route(x, layer, image)
    f32 = torch.float32
    act = swiglu_clamped(linear(x, layer.shared_w1, f32), linear(x, layer.shared_w3, f32), LIMIT)
    shared = linear(act, layer.shared_w2, f32)
    want = routed_experts(x, weights, ids, layer.experts, LIMIT) + shared
    assert torch.equal(moe(x, layer, image), want)


def test_moe_on_a_device_without_host_reads():
    # meta tensors have no values: any host read (.tolist(), .item(), value-dependent shapes) raises
    layer = _layer(torch.Generator().manual_seed(3))
    meta = MoEWeights(
        **{k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in vars(layer).items()
           if k not in ("experts", "shared_w1", "shared_w3", "shared_w2")},
        experts=prepare_experts(*(t.to("meta") for t in vars(layer.experts).values())),
        shared_w1=prepare_linear("fp8", layer.shared_w1.weight.to("meta"), layer.shared_w1.scale.to("meta")),
        shared_w3=prepare_linear("fp8", layer.shared_w3.weight.to("meta"), layer.shared_w3.scale.to("meta")),
        shared_w2=prepare_linear("fp8", layer.shared_w2.weight.to("meta"), layer.shared_w2.scale.to("meta")),
    )
    out = moe(torch.empty(9, 64, device="meta"), meta, torch.zeros(9, dtype=torch.bool, device="meta"))
    assert out.shape == (9, 64) and out.device.type == "meta"


@pytest.mark.parametrize("kind", ["fp8", "fp4", "dense"])
def test_grouped_linear_is_one_product_per_group(kind):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(128, 48, generator=g) * 0.1
    stored = {"fp8": quantize_fp8(w), "fp4": quantize_fp4(w), "dense": (w.bfloat16(), None)}[kind]
    whole = prepare_linear(kind, *stored)
    grouped = prepare_linear(kind, *stored, groups=4)
    x = torch.randn(3, 4 * 48, generator=g)
    dense = whole.dequantized(torch.float32)
    want = torch.cat([x[:, 48 * k : 48 * (k + 1)] @ dense[32 * k : 32 * (k + 1)].T for k in range(4)], dim=-1)
    torch.testing.assert_close(linear(x, grouped, torch.float32), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(linear(x[:, :48], whole, torch.float32), x[:, :48] @ dense.T)


def test_prepare_linear_rejects_bad_input():
    w, s = quantize_fp8(torch.randn(64, 32))
    with pytest.raises(ValueError, match="kind 'fp16'"):
        prepare_linear("fp16", w, s)
    with pytest.raises(ValueError, match="a fp8 linear needs scale"):
        prepare_linear("fp8", w, None)
    with pytest.raises(ValueError, match="64 rows do not split into 3 groups"):
        prepare_linear("fp8", w, s, groups=3)
    with pytest.raises(ValueError, match="whole 32-row scale blocks per group, got 16 rows"):
        prepare_linear("fp8", w, s, groups=4)
    with pytest.raises(ValueError, match=r"w2_scale of shape"):
        ex = _experts(torch.Generator().manual_seed(0), 2, 64, 32)
        prepare_experts(ex.w1, ex.w1_scale, ex.w3, ex.w3_scale, ex.w2, ex.w2_scale[:, :, :0])


class _HalfGroupBackend(Backend):
    name = "half"
    package = "test"

    def supports(self, device: torch.device) -> bool:
        return True

    def ops(self):
        return {"prepare_linear": REFERENCE_OPS["prepare_linear"], "linear": REFERENCE_OPS["linear"]}


def test_a_backend_provides_a_whole_op_group_or_none(monkeypatch):
    backends = {"reference": ops_registry.available_backends()["reference"], "half": _HalfGroupBackend()}
    monkeypatch.setattr(ops_registry, "available_backends", lambda: backends)
    ops_registry._resolve.cache_clear()
    try:
        with pytest.raises(BackendError, match=r"'half' provides \['linear', 'prepare_linear'\] but not "
                                               r"\['moe', 'prepare_experts'\]"):
            get_ops("half", "cpu")
    finally:
        ops_registry._resolve.cache_clear()
