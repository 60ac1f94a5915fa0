"""`ServerState`: everything a route needs, built once at start-up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deepinfer.engine.loader import TextTokenizer
from deepinfer.entrypoints.server.async_engine import AsyncEngine
from deepinfer.entrypoints.server.errors import APIError
from deepinfer.entrypoints.server.metrics import ServerMetrics
from deepinfer.entrypoints.server.store import ResponseStore


@dataclass
class ServerState:
    recipe: Any  # the deepseek_recipe module
    engine: AsyncEngine
    metrics: ServerMetrics
    served_model_names: list[str]
    recipe_tokenizer: Any  # deepseek_recipe.Tokenizer: prompt encoding and stream decoding
    encoding: Any  # DeepseekV41Encoding bound to recipe_tokenizer
    conversion_options: Any
    text_tokenizer: TextTokenizer  # plain-text prompts of /v1/completions and /tokenize
    max_model_len: int
    api_key: str | None = None
    max_body_bytes: int = 16 << 20
    request_timeout: float | None = None
    retry_after_s: int = 1
    ready_stall_s: float = 30.0
    responses: ResponseStore = field(default_factory=ResponseStore)
    started: float = field(default_factory=time.time)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: object) -> str:
        """The served name a request asks for; 404 naming the served ones otherwise."""
        if name not in self.served_model_names:
            raise APIError(404, f"model {name!r} does not exist; this server serves "
                           f"{', '.join(map(repr, self.served_model_names))}", param="model")
        return str(name)
