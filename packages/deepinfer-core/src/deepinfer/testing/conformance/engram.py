"""Conformance cases of the Engram ops (hash rows, FP8 table gather, stream gate), judged on the reference
by Python-integer hashing, per-element decoding and a float64 gate."""

from __future__ import annotations

import math

import torch

from deepinfer.checkpoint.formats import quantize_fp8_rows
from deepinfer.testing.conformance import Case, rand, randint, register

N, HEADS, ROWS, D, M, H = 3, 2, 6, 64, 2, 48
PRIMES = [[61, 67], [71, 73]]  # [N - 1, HEADS]
MULTIPLIERS = [2**61 + 1, 2**60 + 3, 7]  # large odd multipliers: products wrap in int64


def _hash_inputs(device: torch.device, g: torch.Generator):
    primes = torch.tensor(PRIMES, device=device)
    flat = primes.flatten()
    offsets = (flat.cumsum(0) - flat).view_as(primes)
    ngrams = randint(g, 0, 1000, ROWS, N, device=device)
    return (ngrams, torch.tensor(MULTIPLIERS, device=device), primes, offsets), {}


def _wrap(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


def _hash_check(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    ngrams, _, _, offsets = args
    assert out.shape == (ROWS, (N - 1) * HEADS) and out.dtype == torch.int64
    for t, ids in enumerate(ngrams.tolist()):
        rolling = _wrap(ids[0] * MULTIPLIERS[0])
        for s in range(1, N):
            rolling ^= _wrap(ids[s] * MULTIPLIERS[s])
            for h in range(HEADS):
                want = rolling % PRIMES[s - 1][h] + int(offsets[s - 1, h])
                assert int(out[t, (s - 1) * HEADS + h]) == want, (t, s, h)


register(Case("engram_hash", "wrapping", _hash_inputs, _hash_check))


def _lookup_inputs(dtype: torch.dtype):
    def make(device: torch.device, g: torch.Generator):
        table, scale = quantize_fp8_rows(rand(g, 40, D, device=torch.device("cpu"), scale=3.0))
        rows = randint(g, 0, 40, ROWS, HEADS, device=device)
        return (table.to(device), scale.to(device), rows, dtype), {}

    return make


def _lookup_check(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    table, scale, rows, dtype = args
    assert out.shape == (ROWS, HEADS * D) and out.dtype == dtype
    for t in range(ROWS):
        for h in range(HEADS):
            r = int(rows[t, h])
            exps = scale[r].view(torch.uint8).long().repeat_interleave(32)
            want = (table[r].float() * torch.exp2((exps - 127).float())).to(dtype)
            assert torch.equal(out[t, h * D : (h + 1) * D], want), (t, h)


for _dtype in (torch.float32, torch.bfloat16):
    register(Case("engram_lookup", str(_dtype)[6:], _lookup_inputs(_dtype), _lookup_check))


def _gate_inputs(masked: bool):
    def make(device: torch.device, g: torch.Generator):
        args = (rand(g, ROWS, M, H, device=device), rand(g, ROWS, M, H, device=device),
                rand(g, ROWS, H, device=device), rand(g, M, H, device=device))
        mask = torch.tensor([True, False, True, True, False, True], device=device) if masked else None
        return (*args, mask, 1e-6), {}

    return make


def _gate_check(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    streams, keys, value, weights, mask, eps = args
    for t in range(ROWS):
        for i in range(M):
            h, k = streams[t, i].double(), keys[t, i].double()
            rstd = 1 / math.sqrt(float(h.square().mean()) + eps) / math.sqrt(float(k.square().mean()) + eps)
            dot = float((h * weights[i].double() * k).sum()) * rstd / math.sqrt(H)
            gate = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot)))
            if mask is not None and not bool(mask[t]):
                gate = 0.0
            torch.testing.assert_close(out[t, i].double(), h + gate * value[t].double(), atol=1e-5, rtol=1e-5)


for _masked in (False, True):
    register(Case("engram_gate", "masked" if _masked else "all", _gate_inputs(_masked), _gate_check))
