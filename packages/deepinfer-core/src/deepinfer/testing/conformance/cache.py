"""Conformance cases of the cache quantisation ops (encode/decode of the release formats)."""

from __future__ import annotations

import torch

from deepinfer.checkpoint.formats import E2M1_VALUES
from deepinfer.testing.conformance import Case, rand, register

# (quantize op, dequantize op, group, worst relative error of one element against its group amax)
_FORMATS = {
    "fp8": ("fp8_quantize", "fp8_dequantize", 32, 2**-3),
    "nvfp4": ("nvfp4_quantize", "nvfp4_dequantize", 16, 0.25),
    "mxfp4": ("mxfp4_quantize", "mxfp4_dequantize", 32, 0.34),
}


def _quant_inputs(device: torch.device, g: torch.Generator):
    x = rand(g, 5, 64, device=device, scale=3.0)
    x[1] = 0.0  # an all-zero row: the scale floor must keep it finite and exactly zero
    x[2, :16] = 100.0  # a large group next to ordinary ones (within every format's range)
    return (x,), {}


def _round_trip_check(fmt: str):
    _, dequant, group, err = _FORMATS[fmt]

    def check(out, args: tuple, kwargs: dict) -> None:
        from deepinfer.ops.reference import REFERENCE_OPS

        (x,) = args
        data, scale = out
        assert scale.shape == (*x.shape[:-1], x.shape[-1] // group)
        back = REFERENCE_OPS[dequant](data, scale, torch.float32)
        assert back.shape == x.shape and bool(torch.isfinite(back).all())
        assert bool((back[1] == 0).all()), "zero rows must decode to zero"
        amax = x.unflatten(-1, (-1, group)).abs().amax(-1, keepdim=True)
        rel = ((back - x).unflatten(-1, (-1, group)).abs() / amax.clamp_min(1e-30)).amax()
        assert float(rel) <= err, f"{fmt}: round-trip error {float(rel):.3g} of the group maximum > {err}"

    return check


def _as_bytes(out) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t.view(torch.uint8) for t in out)


for _fmt, (_quant, _, _, _) in _FORMATS.items():
    register(Case(_quant, "round-trip", _quant_inputs, _round_trip_check(_fmt),
                  result=lambda out, args, kwargs: _as_bytes(out)))


def _e2m1_exact_inputs(device: torch.device, g: torch.Generator):
    # every E2M1 magnitude times a power of two is representable: the round trip must be exact
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32).repeat(4)[:64].view(2, 32)
    values[0, 0] = 6.0  # group amax exactly at the code maximum
    return (values.to(device) * 4.0,), {}


def _e2m1_exact_check(out, args: tuple, kwargs: dict) -> None:
    from deepinfer.ops.reference import REFERENCE_OPS

    back = REFERENCE_OPS["mxfp4_dequantize"](*out, torch.float32)
    torch.testing.assert_close(back, args[0], atol=0, rtol=0)


register(Case("mxfp4_quantize", "representable-exact", _e2m1_exact_inputs, _e2m1_exact_check,
              result=lambda out, args, kwargs: _as_bytes(out)))


def _dequant_inputs(fmt: str):
    quant = _FORMATS[fmt][0]

    def make(device: torch.device, g: torch.Generator):
        from deepinfer.ops.reference import REFERENCE_OPS

        data, scale = REFERENCE_OPS[quant](rand(g, 3, 64, device=device, scale=2.0))
        return (data, scale, torch.float32), {}

    return make


def _dequant_oracle(fmt: str):
    group = _FORMATS[fmt][2]

    def check(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
        data, scale, dtype = args
        if fmt == "fp8":
            elems = data.float()
        else:  # two E2M1 codes per byte, the even element in the low nibble
            table = torch.tensor(E2M1_VALUES)
            b = data.view(torch.uint8).long().cpu()
            elems = torch.stack((table[b & 15], table[b >> 4]), dim=-1).flatten(-2)
        if fmt == "nvfp4":
            factor = scale.float().cpu()
        else:  # UE8M0: 2^(byte - 127)
            factor = torch.exp2(scale.view(torch.uint8).float().cpu() - 127)
        want = (elems.cpu().unflatten(-1, (-1, group)) * factor.unsqueeze(-1)).flatten(-2)
        assert out.dtype == dtype
        torch.testing.assert_close(out.cpu(), want, atol=0, rtol=0)

    return check


for _fmt, (_, _dequant, _, _) in _FORMATS.items():
    register(Case(_dequant, "random", _dequant_inputs(_fmt), _dequant_oracle(_fmt)))
