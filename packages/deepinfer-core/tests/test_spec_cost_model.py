"""benchmarks/spec_decode.py's full-depth cost model on the CPU: the Flash config's layer kinds, parameters
shared across layers (one storage per name inside the layer, distinct within a layer), prepared weights
shared as well, and a shared-parameter model computing what the same tensors compute without sharing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from deepinfer.checkpoint.inventory import iter_inventory
from deepinfer.config import ModelConfig
from deepinfer.models.deepseek_v41.runtime import build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import get_ops
from deepinfer.testing.configs import tiny_config
from deepinfer.testing.flash import FLASH_TEXT_CONFIG, flash_config_dict

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "spec_decode.py"
    spec = importlib.util.spec_from_file_location("spec_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kinds(config: ModelConfig) -> list[tuple]:
    return [(s.index, s.role, s.compress_ratio, s.kv_source, s.index_k_source, s.topk_source, s.is_engram,
             s.is_yoco_consumer, s.is_dspark_target) for s in config.text.layers]


def test_full_depth_config_is_flash_with_a_small_engram_vocabulary(bench: ModuleType) -> None:
    config = bench.full_depth_config(10_000)
    flash = ModelConfig.from_hf_dict(flash_config_dict())
    assert config.text.num_hidden_layers == 40 and config.text.num_nextn_predict_layers == 3
    assert [s.compress_ratio for s in config.text.layers] == FLASH_TEXT_CONFIG["compress_ratios"]
    assert _kinds(config) == _kinds(flash)
    assert config.text.hidden_size == 5120 and config.text.n_routed_experts == 384
    assert config.text.engram_vocab_size == 10_000
    assert max(config.text.engram_num_embeddings) < 10_000 * 4 * 8  # (Flash: 384M rows per table)


def test_shared_weights_alias_layers_but_not_tensors_of_one_layer(bench: ModuleType) -> None:
    config = tiny_config("full")
    tensors = bench.shared_weights(config, CPU)
    specs = list(iter_inventory(config))
    assert sorted(tensors) == sorted(s.name for s in specs)
    for s in specs:
        assert tuple(tensors[s.name].shape) == tuple(s.shape)
    last = config.text.num_hidden_layers - 1

    def ptr(name: str) -> int:
        return tensors[name].data_ptr()

    for name in ("attn.wq_b.weight", "ffn.experts.3.w1.weight", "ffn.shared_experts.w2.scale", "hc_ffn_fn"):
        assert ptr(f"layers.0.{name}") == ptr(f"layers.{last}.{name}")
    assert ptr("mtp.0.ffn.experts.1.w2.weight") == ptr("mtp.2.ffn.experts.1.w2.weight")
    distinct = [ptr(f"layers.0.ffn.experts.{e}.w1.weight") for e in range(config.text.n_routed_experts)]
    distinct += [ptr("layers.0.ffn.shared_experts.w1.weight"), ptr("layers.0.ffn.shared_experts.w3.weight"),
                 ptr("mtp.0.attn.wq_b.weight")]
    assert len(set(distinct)) == len(distinct)
    w1 = [tensors[f"layers.0.ffn.experts.{e}.w1.weight"] for e in (0, 1)]
    assert not torch.equal(*w1)


def test_reused_preparation_reuses_only_equal_arguments(bench: ModuleType) -> None:
    prepared = bench.ReusedPreparation(lambda w, groups=1: object())
    a = torch.arange(12, dtype=torch.float32).view(3, 4)
    first = prepared(a, groups=1)
    assert prepared(a.clone(), groups=1) is first  # other storage, same bits
    assert prepared(a.clone(), groups=2) is not first
    assert prepared(a + 1, groups=1) is not first
    assert prepared(a.to(torch.float64), groups=1) is not first
    assert prepared.reused == 1
    prepared.forget()
    assert prepared(a, groups=1) is not first


@pytest.fixture(scope="module")
def shared_runtime(bench: ModuleType):
    return bench.build_cost_runtime(tiny_config("full"), CPU, [1], shared=True)


def test_shared_runtime_shares_prepared_weights_across_layers(shared_runtime) -> None:
    config = tiny_config("full")
    blocks, drafts = shared_runtime.model.blocks, shared_runtime.dspark.blocks
    assert [(b.spec.index, b.spec.role, b.spec.compress_ratio) for b in blocks + drafts] == [
        (s.index, s.role, s.compress_ratio) for s in config.text.layers]

    def ptr(blk, part: str) -> int:
        w, attn = blk.moe.weights, blk.attn
        return {"experts": w.experts.w1, "shared_w1": w.shared_w1.weight, "shared_w3": w.shared_w3.weight,
                "w_in": attn.w_in.fused.prepared.weight, "wo_b": attn.wo_b.prepared.weight}[part].data_ptr()

    for part in ("experts", "shared_w1", "w_in", "wo_b"):  # w_in: concatenated per layer, prepared once
        assert len({ptr(b, part) for b in blocks}) == 1, part
        assert len({ptr(b, part) for b in drafts}) == 1, part
        assert ptr(blocks[0], part) != ptr(drafts[0], part)
    assert ptr(blocks[0], "shared_w1") != ptr(blocks[0], "shared_w3")


def test_shared_runtime_computes_what_its_tensors_compute_unshared(bench: ModuleType, shared_runtime) -> None:
    config = tiny_config("full")
    unshared = build_runtime(config, bench.shared_weights(config, CPU), ops=get_ops(device=CPU),
                             engram_token_map=bench.dummy_token_map(config), options=shared_runtime.options)
    logits = []
    for runtime in (shared_runtime, unshared):
        runtime.allocate_cache(num_blocks=2, num_slots=2)
        batch = ForwardBatch([SequenceSegment(1, [1], 0, [5, 9, 7, 11], "all")])
        logits.append(runtime.forward(batch).logits)
    assert torch.equal(logits[0], logits[1])
