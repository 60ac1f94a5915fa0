"""Conformance cases of the attention-side ops: sink attention, interleaved RoPE (also in place, into a
strided view), RMSNorm + RoPE."""

from __future__ import annotations

import math

import torch

from deepinfer.testing.conformance import Case, rand, randint, register


def _sink_inputs(rows: int, heads: int, dim: int, keys: int, k: int, dtype: torch.dtype):
    def make(device: torch.device, g: torch.Generator):
        q = rand(g, rows, heads, dim, device=device, dtype=dtype)
        kv = rand(g, keys, dim, device=device, dtype=dtype)
        idx = randint(g, 0, keys, rows, k, device=device)
        drop = randint(g, 0, 3, rows, k, device=device) == 0  # about a third of the slots empty
        idx = idx.masked_fill(drop, -1)
        if rows > 1:
            idx[-1] = -1  # a row that sees no key at all: only the sink
        sink = rand(g, heads, device=device)
        return (q, kv, idx, sink, dim**-0.5), {}

    return make


def _sink_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    q, kv, idx, sink, scale = args
    assert out.shape == q.shape and out.dtype == q.dtype
    tol = 2e-2 if q.dtype == torch.bfloat16 else 1e-5
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            keys = [kv[i].double() for i in idx[t].tolist() if i >= 0]
            logits = [float(q[t, h].double() @ key) * scale for key in keys] + [float(sink[h])]
            top = max(logits)
            w = [math.exp(v - top) for v in logits]
            total = sum(w)
            want = torch.zeros(q.shape[-1], dtype=torch.float64)
            for wi, key in zip(w, keys):
                want += wi / total * key
            torch.testing.assert_close(out[t, h].double(), want, atol=tol, rtol=tol)


for _dtype in (torch.float32, torch.bfloat16):
    register(Case("sparse_attention_sink", f"ragged-{str(_dtype)[6:]}", _sink_inputs(5, 4, 32, 17, 6, _dtype),
                  _sink_oracle))


def _rope_inputs(inverse: bool):
    def make(device: torch.device, g: torch.Generator):
        x = rand(g, 6, 3, 32, device=device)
        angles = rand(g, 6, 4, device=device, scale=3.0)
        return (x, angles), {"inverse": inverse}

    return make


def _rope_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    x, angles = args
    sign = -1.0 if kwargs["inverse"] else 1.0
    rot = 2 * angles.shape[-1]
    want = x.clone().double()
    for p in range(angles.shape[-1]):
        c, s = angles[:, p].double().cos().unsqueeze(-1), sign * angles[:, p].double().sin().unsqueeze(-1)
        a, b = x[..., x.shape[-1] - rot + 2 * p].double(), x[..., x.shape[-1] - rot + 2 * p + 1].double()
        want[..., x.shape[-1] - rot + 2 * p] = a * c - b * s
        want[..., x.shape[-1] - rot + 2 * p + 1] = a * s + b * c
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


for _inverse in (False, True):
    name = "inverse" if _inverse else "forward"
    register(Case("rope_interleaved", name, _rope_inputs(_inverse), _rope_oracle))


def _rope_inplace_inputs(inverse: bool):
    """x: the first half of each row of a [6, 3, 64] buffer (a strided view, as the fused projections'
    parts are), whose second half keeps a copy of x's values for the oracle."""
    def make(device: torch.device, g: torch.Generator):
        x = rand(g, 6, 3, 32, device=device)
        buf = torch.cat((x, x), dim=-1)
        angles = rand(g, 6, 4, device=device, scale=3.0)
        return (buf[..., :32], angles), {"inverse": inverse, "inplace": True}

    return make


def _rope_inplace_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    x, angles = args
    assert out is x, "rope_interleaved(inplace=True) returns x itself"
    before = x.as_strided(x.shape, x.stride(), x.storage_offset() + x.shape[-1])  # the copy beside x
    _rope_oracle(out, (before, angles), kwargs)


for _inverse in (False, True):
    name = "inverse-inplace" if _inverse else "forward-inplace"
    register(Case("rope_interleaved", name, _rope_inplace_inputs(_inverse), _rope_inplace_oracle))


def _norm_rope_inputs(dtype: torch.dtype):
    def make(device: torch.device, g: torch.Generator):
        x = rand(g, 5, 48, device=device, dtype=dtype, scale=3.0)
        weight = (rand(g, 48, device=device) * 0.2 + 1.0).to(dtype)
        angles = rand(g, 5, 8, device=device, scale=3.0)  # the last 16 of 48 channels rotate
        return (x, weight, 1e-6, angles), {}

    return make


def _norm_rope_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    x, weight, eps, angles = args
    assert out.shape == x.shape and out.dtype == x.dtype
    xd = x.double()
    normed = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype).double()
    rot = 2 * angles.shape[-1]
    a, b = normed[:, -rot::2], normed[:, -rot + 1 :: 2]
    c, s = angles.double().cos(), angles.double().sin()
    want = normed.clone()
    want[:, -rot::2], want[:, -rot + 1 :: 2] = a * c - b * s, a * s + b * c
    tol = 2e-2 if x.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


for _dtype in (torch.float32, torch.bfloat16):
    register(Case("rms_norm_rope", str(_dtype)[6:], _norm_rope_inputs(_dtype), _norm_rope_oracle))
