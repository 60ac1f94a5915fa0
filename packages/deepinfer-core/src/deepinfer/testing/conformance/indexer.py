"""Conformance cases of the lightning-indexer ops."""

from __future__ import annotations

import torch

from deepinfer.testing.conformance import Case, rand, register


def _logits_inputs(rows: int, keys: int, dtype: torch.dtype):
    def make(device: torch.device, g: torch.Generator):
        q = rand(g, rows, 4, 32, device=device, dtype=dtype)
        k = rand(g, keys, 32, device=device, dtype=dtype)
        w = rand(g, rows, 4, device=device)
        return (q, k, w), {}

    return make


def _logits_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    q, k, w = args
    assert out.shape == (q.shape[0], k.shape[0]) and out.dtype == torch.float32
    want = torch.zeros(out.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            want[t] += w[t, h].double() * (k.double() @ q[t, h].double()).clamp_min(0)
    tol = 5e-2 if q.dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


register(Case("indexer_logits", "fp32", _logits_inputs(5, 9, torch.float32), _logits_oracle))
register(Case("indexer_logits", "bf16", _logits_inputs(3, 7, torch.bfloat16), _logits_oracle,
              tol={torch.float32: (5e-2, 2e-2)}))
register(Case("indexer_logits", "no-keys", _logits_inputs(2, 0, torch.float32), _logits_oracle))
