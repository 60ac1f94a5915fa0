"""Conformance cases of the mHC ops: coefficients (projection, RMS, sigmoids, Sinkhorn), collapse, expand,
and the fused collapse + norm and coefficients + expand."""

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


def _oracle_coefficients(args: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64, element by element: z = base + scale * (fn . x) / rms(x); Sinkhorn written as loops."""
    streams, fn, base, scale, iters, hc_eps, norm_eps = args
    x = streams.double().flatten(1)
    z = (x @ fn.double().T) / (x.square().mean(1, keepdim=True) + norm_eps).sqrt()
    s = scale.double()
    z = base.double() + z * torch.cat((s[0].repeat(M), s[1].repeat(M), s[2].repeat(M * M)))
    combs = []
    for t in range(streams.shape[0]):
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
        combs.append(torch.tensor(c, dtype=torch.float64))
    comb = torch.stack(combs) if combs else torch.zeros(0, M, M, dtype=torch.float64)
    return torch.sigmoid(z[:, :M]) + hc_eps, 2 * torch.sigmoid(z[:, M : 2 * M]), comb


def _coefficient_oracle(out: tuple, args: tuple, kwargs: dict) -> None:
    pre, post, comb = out
    rows = args[0].shape[0]
    assert pre.shape == post.shape == (rows, M) and comb.shape == (rows, M, M)
    assert pre.dtype == post.dtype == comb.dtype == torch.float32
    want_pre, want_post, want_comb = _oracle_coefficients(args)
    torch.testing.assert_close(pre.double(), want_pre, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(post.double(), want_post, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(comb.double(), want_comb, atol=1e-5, rtol=1e-5)
    # 20 iterations leave it doubly stochastic to well under a percent
    torch.testing.assert_close(comb.double().sum(1), torch.ones(rows, M, dtype=torch.float64), atol=1e-2,
                               rtol=0)


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


def _collapse_norm_inputs(rows: int, hidden: int):
    def make(device: torch.device, g: torch.Generator):
        (streams, pre), _ = _collapse_inputs(rows, hidden)(device, g)
        return (streams, pre, rand(g, hidden, device=device) * 0.2 + 1.0, 1e-6), {}

    return make


def _collapse_norm_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    """The collapse rounded to the streams' dtype (the two-op model's rounding point), then RMSNorm."""
    streams, pre, weight, eps = args
    assert out.shape == (streams.shape[0], streams.shape[2]) and out.dtype == streams.dtype
    x = sum(pre[:, j, None].double() * streams[:, j].double() for j in range(M)).to(streams.dtype).double()
    want = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight.double()
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=2**-7)


def _residual_inputs(rows: int, hidden: int):
    def make(device: torch.device, g: torch.Generator):
        args, _ = _coefficient_inputs(rows, hidden, torch.bfloat16)(device, g)
        return (rand(g, rows, hidden, device=device, dtype=torch.bfloat16), *args), {}

    return make


def _residual_oracle(out: tuple, args: tuple, kwargs: dict) -> None:
    """pre as hc_coefficients' oracle; the new streams post[k] y + sum_j comb[j, k] R[j] with its post and
    comb."""
    new, pre = out
    y, streams = args[:2]
    want_pre, post, comb = _oracle_coefficients(args[1:])
    assert new.shape == streams.shape and new.dtype == y.dtype and pre.dtype == torch.float32
    torch.testing.assert_close(pre.double(), want_pre, atol=1e-5, rtol=1e-5)
    want = post[:, :, None] * y.double()[:, None] + torch.einsum("tjk,tjh->tkh", comb, streams.double())
    torch.testing.assert_close(new.double(), want, atol=1e-2, rtol=2**-7)


_BF16_ULP = {torch.bfloat16: (1e-5, 2**-7)}
_COEFFICIENT_CASES = (("bf16-streams", 5, 32, torch.bfloat16), ("one-row-fp32", 1, 64, torch.float32),
                      ("no-rows", 0, 32, torch.bfloat16))
for _name, _rows, _hidden, _dtype in _COEFFICIENT_CASES:
    register(Case("hc_coefficients", _name, _coefficient_inputs(_rows, _hidden, _dtype), _coefficient_oracle))
register(Case("hc_collapse", "ragged-width", _collapse_inputs(3, 100), _collapse_oracle, tol=_BF16_ULP))
register(Case("hc_expand", "ragged-width", _expand_inputs(3, 100), _expand_oracle, tol=_BF16_ULP))
# two bf16 rounding points (collapse, then norm): a one-ulp flip of the first can move the second by two
register(Case("hc_collapse_norm", "ragged-width", _collapse_norm_inputs(3, 100), _collapse_norm_oracle,
              tol={torch.bfloat16: (1e-5, 2**-6)}))
for _name, _rows in (("one-row", 1), ("rows", 5)):
    register(Case("hc_residual", _name, _residual_inputs(_rows, 32), _residual_oracle,
                  tol={torch.bfloat16: _BF16_ULP[torch.bfloat16], torch.float32: (2e-5, 2e-5)}))
