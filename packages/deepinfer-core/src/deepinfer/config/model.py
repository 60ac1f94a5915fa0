"""Top-level HF config.json -> ModelConfig, with a family registry keyed by `architectures`.

Only DeepSeek-V4.1 is registered; a V4 family would add its own ModelConfig class to FAMILIES.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deepinfer.config.errors import ConfigError, config_error_from
from deepinfer.config.quantization import QuantizationConfig
from deepinfer.config.text import TextConfig
from deepinfer.config.vision import VisionConfig

V41_ARCHITECTURE = "DeepseekV41ForCausalLM"


class ModelConfig(BaseModel):
    """A whole DeepSeek-V4.1 config.json. `text` / `vision` / `quantization` are the typed sub-configs."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, allow_inf_nan=False)

    architectures: tuple[Literal["DeepseekV41ForCausalLM"]]
    model_type: Literal["deepseek_v41"]
    dtype: Literal["bfloat16"]
    bos_token_id: Literal[0]
    eos_token_id: Literal[1]
    pad_token_id: Literal[2]
    image_token_id: int = Field(ge=0)
    tie_word_embeddings: Literal[False] = False
    tokenizer_compatibility: Literal["release", "native"] | None = None
    quantization: QuantizationConfig = Field(alias="quantization_config")
    text: TextConfig = Field(alias="text_config")
    vision: VisionConfig = Field(alias="vision_config")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.image_token_id >= self.text.vocab_size:
            raise ValueError(f"image_token_id: {self.image_token_id} >= text_config.vocab_size")
        return self

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Parse a config.json dict; every violation raises ConfigError naming the key and the rule."""
        if not isinstance(data, dict):
            raise ConfigError("config.json: top level must be a JSON object")
        arch = data.get("architectures")
        if not (isinstance(arch, list) and len(arch) == 1 and arch[0] in FAMILIES):
            raise ConfigError(
                f"architectures: must be exactly one of {sorted(FAMILIES)}, got {arch!r} "
                "(unknown model family)"
            )
        try:
            return FAMILIES[arch[0]].model_validate(data)
        except ValidationError as exc:
            raise config_error_from(exc) from None

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json content (keys as in the file; defaults never given stay absent)."""
        out = self.model_dump(
            mode="json", by_alias=True, exclude_unset=True, exclude={"quantization", "text", "vision"}
        )
        out["architectures"] = list(self.architectures)
        out["quantization_config"] = self.quantization.to_hf_dict()
        out["text_config"] = self.text.to_hf_dict()
        out["vision_config"] = self.vision.to_hf_dict()
        return out


# architecture name -> config class; one entry per supported model family
FAMILIES: dict[str, type[ModelConfig]] = {V41_ARCHITECTURE: ModelConfig}


def load_model_config(path: str | Path) -> ModelConfig:
    """Read `config.json` from a checkpoint directory (or a path to the JSON file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config.json: not found at {path}") from None
    except OSError as exc:  # unreadable, a directory, a symlink loop, ...
        raise ConfigError(f"config.json: cannot read {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config.json: {path} is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config.json: {path} is not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"config.json: {path} is nested too deeply") from None
    return ModelConfig.from_hf_dict(data)
