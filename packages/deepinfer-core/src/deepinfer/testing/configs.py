"""Named tiny configs (every layer kind, every code path live) and a full-width Flash slice.

Tiny dims keep the whole forward cheap on CPU while preserving the interesting behaviour on a
~100-token prompt: a sliding window of 8, index_topk 8 (fewer than the 50 or 100 compressed entries),
candidate blocks of 8 keeping 8 blocks (prunes from 13), 16 indexer heads (fewer exact ties), and
Engram with tiny hash primes. Vocabulary and Engram compressed size come from the synthetic tokenizer.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from deepinfer.config import ModelConfig, engram_table_rows
from deepinfer.testing.flash import FLASH_TEXT_CONFIG, FLASH_VISION_CONFIG, flash_config_dict, hf_config
from deepinfer.tokenizer import NOISE_TOKEN, build_synthetic_tokenizer, compressed_vocab

TINY_VISION_CONFIG: dict[str, Any] = {
    # present (the config requires it) but zero-depth: no vision weights, like nemo's text-only model
    "num_hidden_layers": 0,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "patch_size": 14,
    "rope_theta": 10000.0,
    "downsample_ratio": 3,
    "max_image_tokens": 64,
    "min_pixels": 3136,
    "max_wh_ratio": None,
}


@cache
def _tokenizer_facts() -> tuple[int, int, int]:
    """(vocab size, Engram compressed vocab size, DSpark noise id) of the synthetic tokenizer."""
    tok = build_synthetic_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    return vocab, compressed_vocab(tok).size, tok.token_to_id(NOISE_TOKEN)


def _tiny_base() -> dict[str, Any]:
    vocab, _, _ = _tokenizer_facts()
    return {
        **copy.deepcopy(FLASH_TEXT_CONFIG),
        "vocab_size": vocab,
        "hidden_size": 128,
        "num_attention_heads": 8,
        "head_dim": 64,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 64,
        "o_lora_rank": 32,
        "o_groups": 2,
        "max_position_embeddings": 4096,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 16,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 256,
        },
        "moe_intermediate_size": 64,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "index_n_heads": 16,
        "index_head_dim": 32,
        "index_topk": 8,
        "candidate_source_layer_id": -1,
        "candidate_topk_blocks": 8,
        "candidate_block_size": 8,
        "hc_sinkhorn_iters": 20,
        "engram_layer_ids": [],
        "engram_num_embeddings": [],
        "num_nextn_predict_layers": 0,
    }


def _with_engram(text: dict[str, Any], layer_ids: list[int]) -> dict[str, Any]:
    _, cvocab, _ = _tokenizer_facts()
    text.update(
        engram_layer_ids=layer_ids,
        engram_max_ngram_size=3,
        engram_vocab_size=61,  # primes just above 60: tables of a few hundred rows
        engram_n_heads=2,
        engram_head_dim=32,
        engram_pad_token_id=2,
        engram_compressed_vocab_size=cvocab,
    )
    text["engram_num_embeddings"] = engram_table_rows(layer_ids, 3, 2, 61)
    return text


def _with_dspark(text: dict[str, Any], targets: list[int], blocks: int = 2) -> dict[str, Any]:
    _, _, noise = _tokenizer_facts()
    text.update(
        num_nextn_predict_layers=blocks,
        dspark_block_size=4,
        dspark_noise_token_id=noise,
        dspark_target_layer_ids=targets,
        dspark_markov_rank=16,
        dspark_n_routed_experts=4,
        dspark_num_experts_per_tok=2,
    )
    return text


def _schedule(text: dict[str, Any], ratios: list[int], kv: list[int], index: list[int]) -> dict[str, Any]:
    text.update(
        num_hidden_layers=len(ratios),
        compress_ratios=ratios + [0] * text["num_nextn_predict_layers"],
        kv_source_layer_ids=kv,
        index_source_layer_ids=index,
    )
    return text


def _tiny(name: str) -> dict[str, Any]:
    t = _tiny_base()
    if name == "swa_only":  # two sliding-window-only layers
        _schedule(t, [0, 0], [], [])
    elif name == "c2":  # SWA, Full C2 (compressor with gate), Reuse
        _schedule(t, [0, 2, 2], [1], [1])
    elif name == "c1_yoco":  # SWA producer, then a ratio-1 consumer half: Full C1 + Reuse
        _schedule(t, [0, 1, 1], [1], [1])
    elif name == "reindex":  # C2 producers, C1 candidate source, Reindex (restricted) + Reuse consumers
        t.update(candidate_source_layer_id=2)
        _schedule(t, [0, 2, 1, 1, 1, 1], [1, 2], [1, 2, 4])
    elif name == "engram":  # Engram on an SWA layer and on a Full C2 layer
        _with_engram(t, [0, 1])
        _schedule(t, [0, 2, 2], [1], [1])
    elif name == "dspark":  # two DSpark blocks fed by the consumer layers
        _with_dspark(t, [2, 3])
        _schedule(t, [0, 2, 1, 1], [1, 2], [1, 2])
    elif name == "full":  # the Flash schedule in miniature: every layer kind and feature at once
        t.update(candidate_source_layer_id=5)
        _with_engram(t, [1, 2])
        _with_dspark(t, [9, 10, 11], blocks=3)
        _schedule(t, [0, 0, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1], [2, 5], [2, 4, 5, 7, 9])
    else:
        raise KeyError(f"unknown tiny config {name!r}; choose from {sorted(TINY_CONFIG_NAMES)}")
    return hf_config(t, TINY_VISION_CONFIG)


TINY_CONFIG_NAMES = ("swa_only", "c2", "c1_yoco", "reindex", "engram", "dspark", "full")


def tiny_config_dict(name: str) -> dict[str, Any]:
    """The config.json dict of a named tiny config (a fresh copy)."""
    return _tiny(name)


def tiny_config(name: str) -> ModelConfig:
    return ModelConfig.from_hf_dict(_tiny(name))


def flash_slice_config_dict(
    num_layers: int = 4,
    n_routed_experts: int | None = None,
    dspark_n_routed_experts: int | None = None,
    engram_vocab_size: int = 100_000,
) -> dict[str, Any]:
    """Full Flash widths with few layers: [SWA+Engram, Full C2, Full C1 (candidates), Reindex, Reuse...]
    plus one DSpark block targeting the last layer. Expert counts default to Flash (384 / 128); the
    Engram tables use a smaller `engram_vocab_size` (Flash: 16M, i.e. 100 GB per table)."""
    if num_layers < 1:
        raise ValueError("num_layers must be >= 1")
    cfg = flash_config_dict()
    t = cfg["text_config"]
    ratios = ([0, 2, 1, 1] + [1] * num_layers)[:num_layers]
    kv = [i for i in (1, 2) if i < num_layers]
    index = [i for i in (1, 2, 3) if i < num_layers]
    t.update(
        num_hidden_layers=num_layers,
        compress_ratios=[*ratios, 0],
        kv_source_layer_ids=kv,
        index_source_layer_ids=index,
        candidate_source_layer_id=2 if num_layers > 2 else -1,
        engram_layer_ids=[0],
        engram_vocab_size=engram_vocab_size,
        engram_num_embeddings=engram_table_rows([0], 4, 8, engram_vocab_size),
        num_nextn_predict_layers=1,
        dspark_target_layer_ids=[num_layers - 1],
    )
    if n_routed_experts is not None:
        t.update(n_routed_experts=n_routed_experts, num_experts_per_tok=min(6, n_routed_experts))
    if dspark_n_routed_experts is not None:
        t.update(
            dspark_n_routed_experts=dspark_n_routed_experts,
            dspark_num_experts_per_tok=min(3, dspark_n_routed_experts),
        )
    cfg["vision_config"] = copy.deepcopy(FLASH_VISION_CONFIG)
    return cfg


def flash_slice_config(**kwargs: Any) -> ModelConfig:
    return ModelConfig.from_hf_dict(flash_slice_config_dict(**kwargs))
