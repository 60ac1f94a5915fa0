"""Conformance cases of the mHC ops: coefficients (projection, RMS, sigmoids, Sinkhorn), collapse, expand."""

from __future__ import annotations

import torch

from deepinfer.testing.conformance import Case, rand, register

M, ITERS, EPS = 4, 20, 1e-6


def _coefficient_inputs(rows: int, hidden: int, dtype: torch.dtype):
    def make(device: torch.device, g: torch.Generator):
        streams = rand(g, rows, M, hidden, device=device, dtype=dtype, scale=3.0)
        fn = rand(g, M * (M + 2), M * hidden, device=device, scale=(M * hidden) ** -0.5)
        base = rand(g, M * (M + 2), device=device, scale=0.5)
        scale = rand(g, 3, device=device).abs() + 0.5
        return (streams, fn, base, scale, ITERS, EPS, EPS), {}

    return make


def _coefficient_oracle(out: tuple, args: tuple, kwargs: dict) -> None:
    """Float64, element by element: z = base + scale * (fn . x) / rms(x); Sinkhorn written as loops."""
    streams, fn, base, scale, iters, hc_eps, norm_eps = args
    pre, post, comb = out
    rows = streams.shape[0]
    assert pre.shape == post.shape == (rows, M) and comb.shape == (rows, M, M)
    assert pre.dtype == post.dtype == comb.dtype == torch.float32
    x = streams.double().flatten(1)
    z = (x @ fn.double().T) / (x.square().mean(1, keepdim=True) + norm_eps).sqrt()
    s = scale.double()
    z = base.double() + z * torch.cat((s[0].repeat(M), s[1].repeat(M), s[2].repeat(M * M)))
    torch.testing.assert_close(pre.double(), torch.sigmoid(z[:, :M]) + hc_eps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(post.double(), 2 * torch.sigmoid(z[:, M : 2 * M]), atol=1e-5, rtol=1e-5)
    for t in range(rows):
        c = [[0.0] * M for _ in range(M)]
        for i in range(M):
            row = [float(v) for v in z[t, 2 * M + i * M : 2 * M + (i + 1) * M]]
            top = max(row)
            e = [torch.tensor(v - top, dtype=torch.float64).exp().item() for v in row]
            c[i] = [v / sum(e) + hc_eps for v in e]
        for it in range(iters):
            if it:  # rows first, except in the first iteration (the softmax normalised them)
                c = [[v / (sum(r) + hc_eps) for v in r] for r in c]
            cols = [sum(c[i][j] for i in range(M)) + hc_eps for j in range(M)]
            c = [[c[i][j] / cols[j] for j in range(M)] for i in range(M)]
        got = comb[t].double()
        torch.testing.assert_close(got, torch.tensor(c, dtype=torch.float64), atol=1e-5, rtol=1e-5)
        # 20 iterations leave it doubly stochastic to well under a percent
        torch.testing.assert_close(got.sum(0), torch.ones(M, dtype=torch.float64), atol=1e-2, rtol=0)


def _collapse_inputs(rows: int, hidden: int):
    def make(device: torch.device, g: torch.Generator):
        streams = rand(g, rows, M, hidden, device=device, dtype=torch.bfloat16)
        return (streams, rand(g, rows, M, device=device).abs()), {}

    return make


def _collapse_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    streams, pre = args
    assert out.shape == (streams.shape[0], streams.shape[2]) and out.dtype == streams.dtype
    want = sum(pre[:, j, None].double() * streams[:, j].double() for j in range(M))
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=2**-7)


def _expand_inputs(rows: int, hidden: int):
    def make(device: torch.device, g: torch.Generator):
        y = rand(g, rows, hidden, device=device, dtype=torch.bfloat16)
        streams = rand(g, rows, M, hidden, device=device, dtype=torch.bfloat16)
        post = rand(g, rows, M, device=device).abs()
        comb = rand(g, rows, M, M, device=device).abs() / M
        return (y, streams, post, comb), {}

    return make


def _expand_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    y, streams, post, comb = args
    assert out.shape == streams.shape and out.dtype == y.dtype
    for k in range(M):
        want = post[:, k, None].double() * y.double()
        want = want + sum(comb[:, j, k, None].double() * streams[:, j].double() for j in range(M))
        torch.testing.assert_close(out[:, k].double(), want, atol=1e-2, rtol=2**-7)


_BF16_ULP = {torch.bfloat16: (1e-5, 2**-7)}
_COEFFICIENT_CASES = (("bf16-streams", 5, 32, torch.bfloat16), ("one-row-fp32", 1, 64, torch.float32),
                      ("no-rows", 0, 32, torch.bfloat16))
for _name, _rows, _hidden, _dtype in _COEFFICIENT_CASES:
    register(Case("hc_coefficients", _name, _coefficient_inputs(_rows, _hidden, _dtype), _coefficient_oracle))
register(Case("hc_collapse", "ragged-width", _collapse_inputs(3, 100), _collapse_oracle, tol=_BF16_ULP))
register(Case("hc_expand", "ragged-width", _expand_inputs(3, 100), _expand_oracle, tol=_BF16_ULP))
