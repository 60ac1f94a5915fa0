"""HF config.json -> typed, validated model configuration (DeepSeek-V4.1)."""

from deepinfer.config.engram_hash import engram_multipliers, engram_primes, engram_table_rows
from deepinfer.config.errors import ConfigError
from deepinfer.config.model import FAMILIES, ModelConfig, load_model_config
from deepinfer.config.quantization import QuantizationConfig
from deepinfer.config.text import RopeScaling, TextConfig
from deepinfer.config.topology import LayerSpec, topology
from deepinfer.config.vision import VisionConfig

__all__ = [
    "FAMILIES",
    "ConfigError",
    "LayerSpec",
    "ModelConfig",
    "QuantizationConfig",
    "RopeScaling",
    "TextConfig",
    "VisionConfig",
    "engram_multipliers",
    "engram_primes",
    "engram_table_rows",
    "load_model_config",
    "topology",
]
