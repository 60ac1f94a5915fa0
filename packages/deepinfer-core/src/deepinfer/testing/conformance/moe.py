"""Conformance cases of the `moe` sub-layer op over experts each backend prepares itself
(`prepare_experts`, `prepare_linear`): experts that receive no token, ragged token counts, image
rows routed with `bias_vl`, more experts than one dequantisation chunk, FP32 and BF16."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from deepinfer.checkpoint.formats import dequantize_fp4, dequantize_fp8, quantize_fp4, quantize_fp8
from deepinfer.ops.weights import MoEWeights
from deepinfer.testing.conformance import Args, Case, rand, register

HIDDEN, INTER, LIMIT, SCALE = 64, 32, 6.0, 2.5


def _inputs(tokens: int, experts: int, topk: int, dtype: torch.dtype, images: bool):
    def make(device: torch.device, g: torch.Generator) -> Args:
        def fp4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
            pairs = [quantize_fp4(torch.randn(rows, cols, generator=g) / cols**0.5) for _ in range(experts)]
            packed, scales = zip(*pairs, strict=True)
            return torch.stack(packed).to(device), torch.stack(scales).to(device)

        def fp8(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
            w, s = quantize_fp8(torch.randn(rows, cols, generator=g) * cols**-0.5)
            return w.to(device), s.to(device)

        raw = {
            "gate": rand(g, experts, HIDDEN, device=device, dtype=torch.bfloat16),
            "bias": rand(g, experts, device=device, scale=0.5),
            "bias_vl": rand(g, experts, device=device, scale=0.5),
            "experts": (*fp4(INTER, HIDDEN), *fp4(INTER, HIDDEN), *fp4(HIDDEN, INTER)),
            "shared": (fp8(INTER, HIDDEN), fp8(INTER, HIDDEN), fp8(HIDDEN, INTER)),
            "topk": topk,
            "dtype": dtype,
        }
        x = rand(g, tokens, HIDDEN, device=device, dtype=dtype, scale=2.0)
        mask = (torch.arange(tokens) % 3 == 1).to(device) if images else None
        return (x, raw, mask), {}

    return make


def _prepare(ops: Mapping[str, Callable], args: tuple, kwargs: dict) -> Args:
    x, raw, mask = args
    w1, w3, w2 = (ops["prepare_linear"]("fp8", w, s) for w, s in raw["shared"])
    layer = MoEWeights(
        gate=raw["gate"], bias=raw["bias"], bias_vl=raw["bias_vl"],
        experts=ops["prepare_experts"](*raw["experts"]), shared_w1=w1, shared_w3=w3, shared_w2=w2,
        topk=raw["topk"], route_scale=SCALE, swiglu_limit=LIMIT, dtype=raw["dtype"],
    )
    return (x, layer, mask), kwargs


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate.clamp(max=LIMIT)) * up.clamp(-LIMIT, LIMIT)


def _oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    """Token by token in float64: route (selection with the bias, weights without), the selected
    experts' SwiGLU FFNs weighted, plus the shared expert."""
    x, layer, mask = args
    ex = layer.experts
    assert out.shape == x.shape and out.dtype == layer.dtype
    xd = x.double()
    scores = torch.sqrt(F.softplus(x.float() @ layer.gate.float().T)).double()
    shared = [dequantize_fp8(p.weight, p.scale, dtype=torch.float64)
              for p in (layer.shared_w1, layer.shared_w3, layer.shared_w2)]
    want = _swiglu(xd @ shared[0].T, xd @ shared[1].T) @ shared[2].T
    for t in range(x.shape[0]):
        bias = layer.bias_vl if mask is not None and bool(mask[t]) else layer.bias
        ids = (scores[t].float() + bias.float()).topk(layer.topk).indices.tolist()
        weights = scores[t, ids] / scores[t, ids].sum() * layer.route_scale
        for e, w in zip(ids, weights, strict=True):
            w1, w3, w2 = (dequantize_fp4(p[e], s[e], dtype=torch.float64)
                          for p, s in ((ex.w1, ex.w1_scale), (ex.w3, ex.w3_scale), (ex.w2, ex.w2_scale)))
            want[t] += w * (_swiglu(xd[t] @ w1.T, xd[t] @ w3.T) @ w2.T)
    # BF16 rounds the input, both products and the activation: a wrong expert still errs by O(1)
    atol, rtol = (0.15, 5e-2) if layer.dtype == torch.bfloat16 else (1e-4, 1e-4)
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=rtol)


# 16 experts, 3 tokens of top-2: at least 10 experts receive no token
register(Case("moe", "empty-experts", _inputs(3, 16, 2, torch.float32, False), _oracle, prepare=_prepare))
register(Case("moe", "one-token", _inputs(1, 8, 3, torch.float32, False), _oracle, prepare=_prepare))
register(Case("moe", "ragged-images", _inputs(40, 8, 3, torch.float32, True), _oracle, prepare=_prepare))
register(Case("moe", "two-chunks", _inputs(7, 20, 4, torch.float32, True), _oracle, prepare=_prepare))
register(Case("moe", "bf16", _inputs(9, 8, 2, torch.bfloat16, False), _oracle, prepare=_prepare,
              tol={torch.bfloat16: (5e-2, 5e-2)}))
