"""The released DeepSeek-V4.1-Flash config.json values (model spec §3), as plain dicts."""

from __future__ import annotations

import copy
from typing import Any

FLASH_TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 5120,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1280,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 16,
        "beta_fast": 32,
        "beta_slow": 1,
        "original_max_position_embeddings": 65536,
    },
    "compress_rope_theta": 160000.0,
    "moe_intermediate_size": 2304,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0] * 3,
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_vocab_size": 16000000,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 3,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128,
    "dspark_num_experts_per_tok": 3,
    "tie_word_embeddings": False,
    "pad_token_id": 2,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "dtype": "bfloat16",
}

FLASH_VISION_CONFIG: dict[str, Any] = {
    "num_hidden_layers": 32,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "intermediate_size": 2816,
    "patch_size": 14,
    "rope_theta": 10000.0,
    "downsample_ratio": 3,
    "max_image_tokens": 1024,
    "min_pixels": 295936,
    "max_wh_ratio": None,
}

RELEASE_QUANTIZATION_CONFIG: dict[str, Any] = {
    "quant_method": "fp8",
    "expert_dtype": "fp4",
    "activation_scheme": "dynamic",
    "weight_block_size": [32, 32],
    "scale_fmt": "ue8m0",
}


def hf_config(text: dict[str, Any], vision: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete config.json dict around the given text (and vision) config."""
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "image_token_id": min(129264, text["vocab_size"] - 1),
        "tie_word_embeddings": False,
        "quantization_config": copy.deepcopy(RELEASE_QUANTIZATION_CONFIG),
        "text_config": copy.deepcopy(text),
        "vision_config": copy.deepcopy(vision if vision is not None else FLASH_VISION_CONFIG),
    }


def flash_config_dict() -> dict[str, Any]:
    """The full Flash config.json as a fresh dict (safe to mutate)."""
    return hf_config(FLASH_TEXT_CONFIG, FLASH_VISION_CONFIG)
