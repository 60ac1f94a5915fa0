"""The default model's config: the Flash layer schedule in miniature, every layer kind present.

Layers: 0 SWA, 1 SWA + Engram, 2 Full C2 + Engram, 3 Reuse, 4 Reindex (C2 group), 5 Full C1 (candidate
source, first YOCO consumer), 6 Reuse, 7 Reindex restricted to candidates, 8 Reuse, 9 Reindex
(restricted), 10-11 Reuse; DSpark blocks mtp.0-2 read layers 9-11. Widths are chosen so that the
release checkpoint stays near 20 MB and a 256-token window exercises pruning: window 64, top-16
compressed entries, candidate blocks of 8 keeping 8 blocks (64 of up to 256 ratio-1 entries).
"""

from __future__ import annotations

import copy
from typing import Any

from tokenizers import Tokenizer

from deepinfer.config import ModelConfig, engram_table_rows
from deepinfer.testing.configs import TINY_VISION_CONFIG
from deepinfer.testing.flash import FLASH_TEXT_CONFIG, hf_config
from deepinfer.tokenizer import NOISE_TOKEN, compressed_vocab

ENGRAM_LAYERS = [1, 2]
ENGRAM_NGRAM, ENGRAM_HEADS, ENGRAM_VOCAB = 3, 4, 3000


def default_model_config(tokenizer: Tokenizer) -> ModelConfig:
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    text: dict[str, Any] = {
        **copy.deepcopy(FLASH_TEXT_CONFIG),
        "vocab_size": vocab,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "head_dim": 64,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 128,
        "o_lora_rank": 64,
        "o_groups": 2,
        "max_position_embeddings": 4096,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 1024,
        },
        "moe_intermediate_size": 128,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 64,
        "index_n_heads": 8,
        "index_head_dim": 32,
        "index_topk": 16,
        "candidate_source_layer_id": 5,
        "candidate_topk_blocks": 8,
        "candidate_block_size": 8,
        "engram_layer_ids": ENGRAM_LAYERS,
        "engram_max_ngram_size": ENGRAM_NGRAM,
        "engram_vocab_size": ENGRAM_VOCAB,
        "engram_n_heads": ENGRAM_HEADS,
        "engram_head_dim": 32,
        "engram_pad_token_id": 2,
        "engram_compressed_vocab_size": compressed_vocab(tokenizer).size,
        "engram_num_embeddings": engram_table_rows(ENGRAM_LAYERS, ENGRAM_NGRAM, ENGRAM_HEADS, ENGRAM_VOCAB),
        "num_nextn_predict_layers": 3,
        "dspark_block_size": 5,
        "dspark_noise_token_id": tokenizer.token_to_id(NOISE_TOKEN),
        "dspark_target_layer_ids": [9, 10, 11],
        "dspark_markov_rank": 32,
        "dspark_n_routed_experts": 4,
        "dspark_num_experts_per_tok": 2,
        "num_hidden_layers": 12,
        "compress_ratios": [0, 0, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
        "kv_source_layer_ids": [2, 5],
        "index_source_layer_ids": [2, 4, 5, 7, 9],
    }
    return ModelConfig.from_hf_dict(hf_config(text, TINY_VISION_CONFIG))
