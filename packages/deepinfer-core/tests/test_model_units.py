"""Unit checks of the model pieces owned outside attention: FP8/FP4 linear, mHC, MoE routing, Engram."""

from __future__ import annotations

import pytest
import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8, quantize_fp8_rows
from deepinfer.config import TextConfig, engram_multipliers, engram_primes, engram_table_rows
from deepinfer.models.deepseek_v41.engram import Engram, EngramHasher
from deepinfer.models.deepseek_v41.linear import make_linear
from deepinfer.models.deepseek_v41.mhc import HyperConnection, initial_streams
from deepinfer.models.deepseek_v41.moe import MoE
from deepinfer.models.deepseek_v41.weights import WeightError, Weights
from deepinfer.ops import get_ops
from deepinfer.ops.reference.moe import route
from deepinfer.testing.flash import FLASH_TEXT_CONFIG

OPS = get_ops("reference")


def _cfg(**overrides) -> TextConfig:
    return TextConfig.from_hf({**FLASH_TEXT_CONFIG, **overrides})


# --- linear


def test_fp8_linear_keeps_storage_and_matches_dequantised_product():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(70, 96, generator=g)
    q, s = quantize_fp8(w)
    lin = make_linear(Weights({"a.weight": q, "a.scale": s}), "a", OPS, torch.float32, (70, 96))
    assert lin.kind == "fp8" and lin.prepared.weight.dtype == torch.float8_e4m3fn
    x = torch.randn(5, 96, generator=g)
    dense = q.float() * s.float().repeat_interleave(32, 0)[:70].repeat_interleave(32, 1)[:, :96]
    torch.testing.assert_close(lin(x), x @ dense.T, rtol=1e-5, atol=1e-5)
    assert (lin(x) - x @ w.T).abs().max() < 0.1 * (x @ w.T).abs().max()


def test_fp4_linear_and_bad_scales_are_named():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 64, generator=g)
    q, s = quantize_fp4(w)
    lin = make_linear(Weights({"e.weight": q, "e.scale": s}), "e", OPS, torch.float32, (8, 64))
    assert lin.kind == "fp4" and lin.prepared.weight.dtype == torch.int8
    assert (lin.dense() - w).abs().max() < 0.5 * w.abs().max()
    bad = s.view(torch.uint8).clone()
    bad[0, 0] = 0xFF
    with pytest.raises(WeightError, match=r"^x\.e\.scale: NaN"):
        make_linear(
            Weights({"x.e.weight": q, "x.e.scale": bad.view(torch.float8_e8m0fnu)}), "x.e", OPS, torch.float32
        )
    with pytest.raises(WeightError, match=r"^e\.weight: shape \[8, 32\], expected \[8, 48\]"):
        make_linear(Weights({"e.weight": q, "e.scale": s}), "e", OPS, torch.float32, (8, 96))


# --- mHC


def test_sinkhorn_is_doubly_stochastic_and_first_collapse_is_embedding():
    cfg = _cfg(hidden_size=64)
    m, h = cfg.hc_mult, cfg.hidden_size
    g = torch.Generator().manual_seed(2)
    hc = HyperConnection(
        torch.randn(m * (m + 2), m * h, generator=g) * 0.1,
        torch.randn(m * (m + 2), generator=g),
        torch.rand(3, generator=g) + 0.5,
        cfg,
        OPS,
    )
    emb = torch.randn(7, h, generator=g)
    streams, pre = initial_streams(emb, m)
    mix = hc(streams)
    assert mix.comb.shape == (7, m, m)
    torch.testing.assert_close(mix.comb.sum(-1), torch.ones(7, m), atol=1e-3, rtol=0)
    torch.testing.assert_close(mix.comb.sum(-2), torch.ones(7, m), atol=1e-3, rtol=0)
    assert bool(((mix.post > 0) & (mix.post < 2)).all()) and bool((mix.pre > cfg.hc_eps).all())
    torch.testing.assert_close(hc.collapse(streams, pre), emb)
    # expansion: R'[k] = post[k] y + sum_j comb[j, k] R[j]
    y = torch.randn(7, h, generator=g)
    new = hc.expand(y, streams, mix)
    k = 2
    ref = mix.post[:, k, None] * y + sum(mix.comb[:, j, k, None] * streams[:, j] for j in range(m))
    torch.testing.assert_close(new[:, k], ref)


# --- MoE


def _moe(cfg: TextConfig, g: torch.Generator) -> MoE:
    return MoE.load(Weights(_moe_tensors(cfg, g)), cfg, cfg.n_routed_experts, cfg.num_experts_per_tok, OPS,
                    torch.float32)


def _moe_tensors(cfg: TextConfig, g: torch.Generator) -> dict[str, torch.Tensor]:
    h, i, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    t: dict[str, torch.Tensor] = {
        "gate.weight": torch.randn(e, h, generator=g).bfloat16(),
        "gate.bias": torch.randn(e, generator=g),
        "gate.bias_vl": torch.randn(e, generator=g),
    }
    for name, (r, c) in {"w1": (i, h), "w3": (i, h), "w2": (h, i)}.items():
        t[f"shared_experts.{name}.weight"], t[f"shared_experts.{name}.scale"] = quantize_fp8(
            torch.randn(r, c, generator=g) * 0.1
        )
        for x in range(e):
            t[f"experts.{x}.{name}.weight"], t[f"experts.{x}.{name}.scale"] = quantize_fp4(
                torch.randn(r, c, generator=g) * 0.1
            )
    return t


def test_moe_load_stacks_the_experts_and_releases_the_per_expert_tensors():
    cfg = _cfg(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3)
    t = _moe_tensors(cfg, torch.Generator().manual_seed(6))
    w2_5 = t["experts.5.w2.weight"]
    experts = MoE.load(Weights(t), cfg, 8, 3, OPS, torch.float32).weights.experts
    assert experts.w1.shape == (8, 32, 32) and experts.w2_scale.shape == (8, 64, 1)
    assert torch.equal(experts.w2[5], w2_5)
    assert not [k for k in t if k.startswith("experts.")] and "shared_experts.w1.weight" in t


def test_moe_routing_uses_bias_for_selection_only():
    cfg = _cfg(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3)
    g = torch.Generator().manual_seed(3)
    layer = _moe(cfg, g).weights
    x = torch.randn(6, 64, generator=g)
    weights, ids = route(x, layer, None)
    scores = torch.sqrt(torch.nn.functional.softplus(x @ layer.gate.float().T))
    assert torch.equal(ids, (scores + layer.bias).topk(3).indices)
    torch.testing.assert_close(weights.sum(-1), torch.full((6,), 1.5))
    torch.testing.assert_close(
        weights, 1.5 * scores.gather(1, ids) / scores.gather(1, ids).sum(-1, keepdim=True)
    )
    image = torch.tensor([True, False] * 3)
    _, ids_vl = route(x, layer, image)
    assert torch.equal(ids_vl[0], (scores[0] + layer.bias_vl).topk(3).indices)
    assert torch.equal(ids_vl[1], ids[1])


def test_moe_output_equals_dense_expert_sum():
    cfg = _cfg(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3)
    g = torch.Generator().manual_seed(4)
    moe = _moe(cfg, g)
    layer = moe.weights
    x = torch.randn(5, 64, generator=g) * 3
    weights, ids = route(x, layer, None)

    def ffn(w1, w3, w2, v):
        return w2(torch.nn.functional.silu((w1(v)).clamp(max=10)) * w3(v).clamp(-10, 10))

    def shared(name):
        return lambda v: OPS.linear(v, getattr(layer, f"shared_{name}"), torch.float32)

    e = layer.experts
    ref = ffn(shared("w1"), shared("w3"), shared("w2"), x)
    for t in range(5):
        for s in range(3):
            k = int(ids[t, s])
            lin = [
                make_linear(
                    Weights({"w.weight": getattr(e, n)[k], "w.scale": getattr(e, f"{n}_scale")[k]}),
                    "w",
                    OPS,
                    torch.float32,
                )
                for n in ("w1", "w3", "w2")
            ]
            ref[t] += weights[t, s] * ffn(*lin, x[t : t + 1])[0]
    torch.testing.assert_close(moe(x), ref, rtol=1e-4, atol=1e-4)


# --- Engram


def test_engram_constants_of_the_flash_config_match_the_spec():
    cfg = _cfg()
    assert engram_multipliers(1, 4, cfg.engram_compressed_vocab_size) == [
        76632096046245,
        4839876093313,
        35959672319349,
        73987337458391,
    ]
    assert engram_multipliers(14, 4, cfg.engram_compressed_vocab_size) == [
        67716810739261,
        51510806800915,
        30921347202721,
        82619226485591,
    ]
    primes = engram_primes(cfg.engram_layer_ids, 4, 8, cfg.engram_vocab_size)
    assert primes[0][0][0] == 16000057 and primes[0][2][7] == 16000463
    assert primes[1][0][0] == 16000477 and primes[1][2][7] == 16000889
    assert cfg.engram_rows == [384006168, 384016682]
    hasher = EngramHasher.build(cfg, list(range(cfg.engram_compressed_vocab_size)), OPS, torch.device("cpu"))
    assert int(hasher.offsets[0][2, 7]) + primes[0][2][7] == 384006168
    assert hasher.multipliers[1].tolist() == engram_multipliers(14, 4, cfg.engram_compressed_vocab_size)


def test_engram_rows_follow_the_hash_rule():
    cfg = _cfg(engram_compressed_vocab_size=50)
    token_map = [i % 50 for i in range(80)]
    hasher = EngramHasher.build(cfg, token_map, OPS, torch.device("cpu"))
    pad = token_map[2]
    assert hasher.pad_id == pad
    ngrams = torch.tensor([[pad, pad, pad, pad], [11, pad, pad, pad], [3, 11, 20, 49]])
    rows = hasher.rows(0, ngrams)
    mu, primes = (
        hasher.multipliers[0].tolist(),
        engram_primes(cfg.engram_layer_ids, 4, 8, cfg.engram_vocab_size)[0],
    )
    x = ngrams[2].tolist()
    h = x[0] * mu[0]
    offset = 0
    for order in range(3):
        h ^= x[order + 1] * mu[order + 1]
        for head in range(8):
            assert int(rows[2, order * 8 + head]) == h % primes[order][head] + offset
            offset += primes[order][head]


def test_engram_gate_adds_gated_value_to_every_stream():
    rows = engram_table_rows([1], 3, 2, 10)[0]
    cfg = _cfg(
        hidden_size=64,
        engram_head_dim=32,
        engram_n_heads=2,
        engram_max_ngram_size=3,
        engram_vocab_size=10,
        engram_layer_ids=[1],
        engram_num_embeddings=[rows],
    )
    g = torch.Generator().manual_seed(5)
    m, h, d = cfg.hc_mult, 64, 32
    table, tscale = quantize_fp8_rows(torch.randn(rows, d, generator=g))
    wkv, wscale = quantize_fp8(torch.randn((m + 1) * h, 4 * d, generator=g) * 0.05)
    t = {
        "embed.weight": table,
        "embed.scale": tscale,
        "wkv.weight": wkv,
        "wkv.scale": wscale,
        "q_weight": torch.rand(m, h, generator=g).bfloat16(),
        "k_weight": torch.rand(m, h, generator=g).bfloat16(),
    }
    eg = Engram.load(Weights(t), cfg, 0, OPS, torch.float32)
    streams = torch.randn(3, m, h, generator=g)
    idx = torch.randint(0, rows, (3, 4), generator=g)
    out = eg(streams, idx, torch.tensor([True, True, False]))
    e = (table.float() * tscale.float().repeat_interleave(32, 1))[idx].flatten(1)
    kv = e @ eg.wkv.dense().T
    keys, v = kv[:, : m * h].view(3, m, h), kv[:, m * h :]
    w = eg.gate_weight
    for i in range(m):
        r, k = streams[:, i], keys[:, i]
        dot = (r * w[i] * k).sum(-1) / (r.pow(2).mean(-1).sqrt() * k.pow(2).mean(-1).sqrt() * h**0.5)
        gate = torch.sigmoid(dot.sign() * dot.abs().clamp_min(1e-6).sqrt())
        gate[2] = 0
        torch.testing.assert_close(out[:, i], r + gate[:, None] * v, rtol=1e-4, atol=1e-5)
