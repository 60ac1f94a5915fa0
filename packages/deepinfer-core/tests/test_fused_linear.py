"""Load-time weight layouts of the decode step on the reference ops: stacked projections
(`make_fused_linear`), the operand dtype of dense weights, the indexer's folded head-weight scale."""

from __future__ import annotations

import pytest
import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.models.deepseek_v41.indexer import Indexer
from deepinfer.models.deepseek_v41.linear import make_fused_linear, make_linear
from deepinfer.models.deepseek_v41.weights import WeightError, Weights
from deepinfer.ops import get_ops
from deepinfer.testing.configs import flash_slice_config

OPS = get_ops("reference", "cpu")


def _fp8(tensors: dict, name: str, rows: int, cols: int, g: torch.Generator) -> None:
    tensors[f"{name}.weight"], tensors[f"{name}.scale"] = quantize_fp8(torch.randn(rows, cols, generator=g))


def _separate(tensors: dict, shapes: list, x: torch.Tensor) -> list[torch.Tensor]:
    return [make_linear(Weights(tensors), n, OPS, torch.float32, s)(x) for n, s in shapes]


@pytest.mark.parametrize("last_rows", [64, 40])  # the last part may end in a partial FP8 scale block
def test_fp8_parts_stack_into_one_weight_and_match_the_separate_linears(last_rows):
    g = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    shapes = [("a", (96, 128)), ("b", (last_rows, 128))]
    for name, (rows, cols) in shapes:
        _fp8(tensors, name, rows, cols, g)
    x = torch.randn(3, 128, generator=g)
    want = _separate(tensors, shapes, x)
    fused = make_fused_linear(Weights(tensors), shapes, OPS, torch.float32)
    assert fused.fused is not None and fused.fused.out_features == 96 + last_rows
    assert not tensors  # the separate checkpoint tensors were released
    got = fused(x)
    for g_out, w_out, part in zip(got, want, fused.parts, strict=True):
        torch.testing.assert_close(g_out, w_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(part(x), w_out, rtol=1e-5, atol=1e-5)
    # the parts are row slices of the stacked storage, not copies
    stacked = fused.fused.prepared.weight
    assert fused.parts[1].prepared.weight.data_ptr() == stacked[96].data_ptr()
    torch.testing.assert_close(fused.stacked(x), torch.cat(want, dim=-1), rtol=1e-5, atol=1e-5)


def test_parts_that_cannot_stack_run_one_by_one():
    g = torch.Generator().manual_seed(1)
    tensors: dict[str, torch.Tensor] = {}
    _fp8(tensors, "a", 40, 64, g)  # a partial scale block before the last part
    _fp8(tensors, "b", 32, 64, g)
    tensors["c.weight"], tensors["c.scale"] = quantize_fp4(torch.randn(8, 64, generator=g))
    shapes = [("a", (40, 64)), ("b", (32, 64))]
    x = torch.randn(2, 64, generator=g)
    want = _separate(tensors, shapes, x)
    for linears in (shapes, [("b", (32, 64)), ("c", (8, 64))]):  # partial block; mixed kinds
        fused = make_fused_linear(Weights(tensors), linears, OPS, torch.float32)
        assert fused.fused is None and len(fused.parts) == 2
    fused = make_fused_linear(Weights(tensors), shapes, OPS, torch.float32)
    for got, expected in zip(fused(x), want, strict=True):
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(fused.stacked(x), torch.cat(want, dim=-1))
    with pytest.raises(WeightError, match=r"^b\.weight: shape \[32, 64\], expected \[16, 64\]"):
        make_fused_linear(Weights(tensors), [("a", (40, 64)), ("b", (16, 64))], OPS, torch.float32)


def test_dense_parts_stack_without_per_part_linears():
    g = torch.Generator().manual_seed(2)
    tensors = {"g.weight": torch.randn(16, 32, generator=g), "v.weight": torch.randn(8, 32, generator=g)}
    x = torch.randn(4, 32, generator=g).bfloat16()
    want = torch.cat((x.float() @ tensors["g.weight"].T, x.float() @ tensors["v.weight"].T), dim=-1)
    fused = make_fused_linear(Weights(dict(tensors)), [("g", (16, 32)), ("v", (8, 32))], OPS, torch.float32,
                              operand_dtype=torch.bfloat16, with_parts=False)
    assert fused.parts == () and fused.sizes == (16, 8)
    # the reference keeps the float32 storage whatever the operand dtype
    assert fused.fused.prepared.weight.dtype == torch.float32
    torch.testing.assert_close(fused.stacked(x), want)
    a, b = fused(x)
    assert a.shape == (4, 16) and b.shape == (4, 8)


def test_power_of_two_index_weight_scale_is_folded_into_the_projection_bit_for_bit():
    cfg = flash_slice_config(num_layers=2).text
    spec = cfg.layers[1]  # owns index keys and queries
    g = torch.Generator().manual_seed(3)
    proj = (torch.randn(cfg.index_n_heads, cfg.hidden_size, generator=g) * 0.05).bfloat16()
    tensors = {"weights_proj.weight": proj, "k_norm.weight": torch.ones(cfg.index_head_dim).bfloat16(),
               "wk.weight": torch.randn(cfg.index_head_dim, cfg.head_dim, generator=g).bfloat16()}
    indexer = Indexer(cfg, spec, Weights(tensors), OPS, torch.bfloat16)
    assert indexer.weight_scale == 1.0  # (32 * 128) ** -0.5 = 2^-6: folded
    x = torch.randn(4, cfg.hidden_size, generator=g).bfloat16()
    unfolded = make_linear(Weights(tensors), "weights_proj", OPS, torch.bfloat16)(x) * 2**-6
    assert torch.equal(indexer.weights_proj(x), unfolded)
