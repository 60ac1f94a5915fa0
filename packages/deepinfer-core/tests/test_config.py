"""Config parsing: every validation rule names its key; config.json round-trips; topology matches §4.3."""

from __future__ import annotations

import json

import pytest

from deepinfer.config import ConfigError, ModelConfig, engram_multipliers, engram_primes, load_model_config
from deepinfer.testing import TINY_CONFIG_NAMES, flash_config_dict, tiny_config, tiny_config_dict


def _text(d):
    return d["text_config"]


def _set(path, value):
    """Mutation setting d[path[0]]...[path[-1]] = value."""

    def mutate(d):
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value

    return mutate


def _pop(path):
    def mutate(d):
        for key in path[:-1]:
            d = d[key]
        del d[path[-1]]

    return mutate


FLASH_RATIOS = [0, 0] + [2] * 18 + [1] * 20 + [0] * 3

# (mutation, substring expected in the error: the key and the rule)
RULES = {
    "unknown architecture": (
        _set(["architectures"], ["DeepseekV4ForCausalLM"]),
        "architectures: must be exactly",
    ),
    "two architectures": (
        _set(["architectures"], ["DeepseekV41ForCausalLM", "DeepseekV41ForCausalLM"]),
        "architectures:",
    ),
    "model_type": (_set(["model_type"], "deepseek_v4"), "model_type:"),
    "top dtype": (_set(["dtype"], "float16"), "dtype:"),
    "eos id": (_set(["eos_token_id"], 2), "eos_token_id:"),
    "bos id": (_set(["bos_token_id"], 1), "bos_token_id:"),
    "pad id text": (_set(["text_config", "pad_token_id"], 0), "text_config.pad_token_id:"),
    "missing text_config": (_pop(["text_config"]), "text_config: missing required key"),
    "missing vision_config": (_pop(["vision_config"]), "vision_config: missing required key"),
    "missing hidden_size": (
        _pop(["text_config", "hidden_size"]),
        "text_config.hidden_size: missing required key",
    ),
    "quant method": (
        _set(["quantization_config", "quant_method"], "int8"),
        "quantization_config.quant_method:",
    ),
    "quant block": (_set(["quantization_config", "weight_block_size"], [128, 128]), "weight_block_size"),
    "quant scale_fmt": (_set(["quantization_config", "scale_fmt"], "e4m3"), "quantization_config.scale_fmt:"),
    "quant extra": (_set(["quantization_config", "fmt"], "x"), "quantization_config.fmt:"),
    "kv heads": (_set(["text_config", "num_key_value_heads"], 2), "text_config.num_key_value_heads:"),
    "hidden_act": (_set(["text_config", "hidden_act"], "gelu"), "text_config.hidden_act:"),
    "scoring": (_set(["text_config", "scoring_func"], "sigmoid"), "text_config.scoring_func:"),
    "rope >= head_dim": (
        _set(["text_config", "qk_rope_head_dim"], 512),
        "text_config.qk_rope_head_dim: must be even",
    ),
    "o_groups": (_set(["text_config", "o_groups"], 7), "text_config.o_groups: must divide"),
    "hidden multiple of 32": (
        _set(["text_config", "hidden_size"], 5000),
        "text_config.hidden_size: must be a multiple",
    ),
    "topk experts": (_set(["text_config", "num_experts_per_tok"], 400), "text_config.num_experts_per_tok:"),
    "yarn betas": (
        _set(["text_config", "rope_scaling", "beta_fast"], 0.5),
        "text_config.rope_scaling.beta_fast:",
    ),
    "yarn type": (
        _set(["text_config", "rope_scaling", "rope_type"], "linear"),
        "text_config.rope_scaling.rope_type:",
    ),
    "ratio 4": (
        _set(["text_config", "compress_ratios"], [0, 0, 4, *FLASH_RATIOS[3:]]),
        "values [4] not in {0, 1, 2}",
    ),
    "ratios length": (_set(["text_config", "compress_ratios"], FLASH_RATIOS[:40]), "compress_ratios: needs"),
    "dspark ratio": (_set(["text_config", "compress_ratios"], [*FLASH_RATIOS[:42], 2]), "DSpark entries"),
    "mixed ratios": (
        _set(["text_config", "compress_ratios"], [*FLASH_RATIOS[:25], 2, *FLASH_RATIOS[26:]]),
        "mixed ratios inside a sharing segment",
    ),
    "uncovered compressed layer": (
        _set(["text_config", "compress_ratios"], [0, 2, *FLASH_RATIOS[2:]]),
        "layer 1 has ratio 2 but no KV source",
    ),
    "segment crosses YOCO": (
        _set(["text_config", "kv_source_layer_ids"], [2, 8, 14]),
        "kv_source_layer_ids: the segment of source 14 crosses the YOCO boundary",
    ),
    "source at swa layer": (
        _set(["text_config", "kv_source_layer_ids"], [1, 2, 8, 14, 20]),
        "has compress ratio 0",
    ),
    "sources unsorted": (_set(["text_config", "kv_source_layer_ids"], [8, 2, 14, 20]), "strictly increasing"),
    "source out of range": (
        _set(["text_config", "index_source_layer_ids"], [2, 8, 14, 20, 44]),
        "[44] outside [0, 40)",
    ),
    "non-nesting index": (
        _set(["text_config", "index_source_layer_ids"], [8, 14, 20, 24]),
        "index_source_layer_ids: must contain every index-K source, missing [2]",
    ),
    "non-nesting index_k": (
        _set(["text_config", "index_k_source_layer_ids"], [2, 8, 14]),
        "index_k_source_layer_ids: must contain every KV source, missing [20]",
    ),
    "index_k not index": (
        _set(["text_config", "index_k_source_layer_ids"], [2, 8, 14, 20, 22]),
        "index_source_layer_ids: must contain every index-K source, missing [22]",
    ),
    "topk > capacity": (
        _set(["text_config", "index_topk"], 20000),
        "index_topk: 20000 exceeds candidate capacity",
    ),
    "candidate block size": (
        _set(["text_config", "candidate_block_size"], 4),
        "candidate_block_size: must be 8 or 16",
    ),
    "candidate blocks multiple": (_set(["text_config", "candidate_topk_blocks"], 2044), "multiple of 8"),
    "candidate not index source": (
        _set(["text_config", "candidate_source_layer_id"], 21),
        "candidate_source_layer_id:",
    ),
    "candidate not kv source": (
        _set(["text_config", "candidate_source_layer_id"], 24),
        "candidate_source_layer_id: layer 24 is not a KV source",
    ),
    "engram consumer": (
        _set(["text_config", "engram_layer_ids"], [1, 24]),
        "engram_layer_ids: layers [24] lie in",
    ),
    "engram rows": (
        _set(["text_config", "engram_num_embeddings"], [384006168, 1]),
        "engram_num_embeddings: must equal",
    ),
    "engram missing key": (_pop(["text_config", "engram_head_dim"]), "engram_head_dim: required when"),
    "engram pad": (_set(["text_config", "engram_pad_token_id"], 200000), "engram_pad_token_id:"),
    "dspark missing key": (_pop(["text_config", "dspark_markov_rank"]), "dspark_markov_rank: required when"),
    "dspark straddle": (
        _set(["text_config", "dspark_target_layer_ids"], [19, 20]),
        "straddle the YOCO boundary",
    ),
    "dspark noise": (_set(["text_config", "dspark_noise_token_id"], 129280), "dspark_noise_token_id:"),
    "dspark attn input": (
        _set(["text_config", "dspark_target_attn_input"], False),
        "dspark_target_attn_input:",
    ),
    "image token": (_set(["image_token_id"], 129280), "image_token_id:"),
    "vision heads": (_set(["vision_config", "num_attention_heads"], 3), "vision_config.num_attention_heads:"),
    "tied embeddings": (
        _set(["text_config", "tie_word_embeddings"], True),
        "text_config.tie_word_embeddings:",
    ),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_violation_names_key(rule):
    mutate, expected = RULES[rule]
    d = flash_config_dict()
    mutate(d)
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_hf_dict(d)
    assert expected in str(info.value)
    assert isinstance(info.value, ValueError)


def test_flash_parses_and_round_trips(tmp_path):
    d = flash_config_dict()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    cfg = load_model_config(tmp_path)
    assert cfg.to_hf_dict() == d
    assert load_model_config(path).to_hf_dict() == d
    assert ModelConfig.from_hf_dict(json.loads(json.dumps(cfg.to_hf_dict()))) == cfg


def test_unknown_keys_survive_round_trip():
    d = flash_config_dict()
    d["transformers_version"] = "5.18.0"
    d["text_config"]["model_type"] = "deepseek_v41_text"
    assert ModelConfig.from_hf_dict(d).to_hf_dict() == d


def test_optional_keys_defaults():
    t = ModelConfig.from_hf_dict(flash_config_dict()).text
    assert t.hc_shifted is True and t.use_fp4_sparse_kv is True
    assert t.index_k_sources == [2, 8, 14, 20]
    assert t.kv_lora_rank == 448 and t.n_prefill_layer == 20
    assert "index_k_source_layer_ids" not in t.to_hf_dict()


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_config(tmp_path)


def test_flash_topology_matches_spec_table():
    layers = ModelConfig.from_hf_dict(flash_config_dict()).text.layers
    assert len(layers) == 43
    roles = [s.role for s in layers]
    assert roles[:2] == ["swa", "swa"] and roles[40:] == ["dspark"] * 3
    assert [i for i, r in enumerate(roles) if r == "full"] == [2, 8, 14, 20]
    assert [i for i, r in enumerate(roles) if r == "reindex"] == [24, 28, 32, 36]
    assert [s.kv_source for s in layers[15:22]] == [14] * 5 + [20, 20]
    assert [s.topk_source for s in layers[36:40]] == [36] * 4
    assert [s.index for s in layers if s.is_candidate_source] == [20]
    assert [s.index for s in layers if s.restricted_to_candidates] == [24, 28, 32, 36]
    assert [s.index for s in layers if s.is_engram] == [1, 14]
    assert [s.index for s in layers if s.is_dspark_target] == [37, 38, 39]
    assert [s.index for s in layers if s.is_yoco_consumer] == list(range(20, 40))
    assert layers[0].rope_theta == 10000.0 and not layers[0].uses_yarn
    assert layers[3].rope_theta == 160000.0 and layers[3].uses_yarn
    assert layers[41].prefix == "mtp.1" and layers[41].rope_theta == 10000.0


def test_separate_index_k_sources():
    d = flash_config_dict()
    d["text_config"]["index_k_source_layer_ids"] = [2, 8, 14, 20, 28]
    layers = ModelConfig.from_hf_dict(d).text.layers
    assert [s.index_k_source for s in layers[26:31]] == [20, 20, 28, 28, 28]
    assert layers[28].owns_index_keys and not layers[28].owns_compressor and layers[28].kv_source == 20


def test_engram_hash_constants_match_spec():
    primes = engram_primes([1, 14], 4, 8, 16_000_000)
    assert primes[0][0][:3] == [16000057, 16000079, 16000081] and primes[1][2][-1] == 16000889
    assert engram_multipliers(1, 4, 99092) == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
    assert engram_multipliers(14, 4, 99092)[0] == 67716810739261


@pytest.mark.parametrize("name", TINY_CONFIG_NAMES)
def test_tiny_configs_valid_and_round_trip(name):
    cfg = tiny_config(name)
    assert cfg.to_hf_dict() == tiny_config_dict(name)


def test_tiny_configs_cover_every_layer_kind():
    seen = set()
    for name in TINY_CONFIG_NAMES:
        for s in tiny_config(name).text.layers:
            seen.add(s.role)
            seen |= {
                f
                for f in (
                    "is_candidate_source",
                    "restricted_to_candidates",
                    "is_engram",
                    "is_yoco_consumer",
                    "is_dspark_target",
                )
                if getattr(s, f)
            }
            if s.compress_ratio:
                seen.add(f"C{s.compress_ratio}")
    assert seen >= {
        "swa",
        "full",
        "reindex",
        "reuse",
        "dspark",
        "C1",
        "C2",
        "is_candidate_source",
        "restricted_to_candidates",
        "is_engram",
        "is_yoco_consumer",
        "is_dspark_target",
    }
