"""`SamplingParams`: what a request asks of the sampler, validated before any work is done."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator


class FunctionTool(BaseModel):
    """A tool the model may call: its name and the JSON Schema of its arguments (an object schema)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]+$")
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolCallConstraint(BaseModel):
    """Tool calls in DeepSeek's DSML syntax (deepseek-recipe spec §6.3).

    `required`: the output is one DSML block of one or more calls of these tools, each with arguments
    valid under its schema. `auto`: free text, or free text followed by such a block. `opened`: the
    prompt already ends with the block's opening tag (a required choice with thinking off).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tools: list[FunctionTool] = Field(min_length=1)
    mode: Literal["auto", "required"] = "required"
    dsml: Literal["v4", "v4.1"] = "v4.1"
    opened: bool = False

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, v: list[FunctionTool]) -> list[FunctionTool]:
        names = [t.name for t in v]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        return v


class StructuredOutputs(BaseModel):
    """A constraint on the generated text: exactly one of `json_schema`, `json_object`, `regex`,
    `grammar` (Lark, or GBNF/EBNF as llama.cpp writes it), `choice` or `tools`.

    `start_after`: text of the token(s) after which the constraint starts (typically `"</think>"` for
    a thinking prompt); before them generation is free. The grammar is checked here, so a malformed
    schema, regex or grammar is a `ValueError` when the request is made.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    json_schema: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    tools: ToolCallConstraint | None = None
    start_after: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputs:
        kinds = [k for k in _VALUED_KINDS if getattr(self, k) is not None]
        kinds += ["json_object"] if self.json_object else []
        if len(kinds) != 1:
            raise ValueError("structured_outputs needs exactly one of json_schema, json_object, regex, "
                             f"grammar, choice, tools; got {kinds or 'none'}")
        from deepinfer.structured.grammar import check  # the backend checks the grammar's syntax

        check(self)
        return self

    @property
    def kind(self) -> str:
        """Which constraint is set: the name of its field."""
        if self.json_object:
            return "json_object"
        return next(k for k in _VALUED_KINDS if getattr(self, k) is not None)


_VALUED_KINDS = ("json_schema", "regex", "grammar", "choice", "tools")


class SamplingParams(BaseModel):
    """Per-request sampling and stopping settings.

    Unknown keys and out-of-range values raise `pydantic.ValidationError` (a `ValueError`) at
    construction, so `LLMEngine.add_request` rejects a malformed request before scheduling it.
    `temperature=0` means greedy. `seed` (alias `seq_seed`) keys a counter-based RNG on
    (seed, position, purpose): a seeded request samples the same tokens whatever else is batched.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    n: int = Field(1, ge=1, le=128, description="independent completions sharing one prompt prefill")
    max_tokens: int | None = Field(16, ge=1, description="None: until max_model_len")
    min_tokens: int = Field(0, ge=0, description="EOS and stop_token_ids are masked until this many")
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0 = greedy")
    top_k: int = Field(-1, description="keep the k most likely tokens; -1 or 0 disables")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    logit_bias: dict[int, float] = Field(default_factory=dict)
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[StrictInt] = Field(default_factory=list)  # strict: 5.0 or True is no token id
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0, le=20, description="top-k logprobs per output token")
    prompt_logprobs: int | None = Field(None, ge=0, le=20, description="top-k logprobs per prompt token")
    seed: int | None = Field(None, ge=0, lt=2**64, alias="seq_seed")
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, v: list[str]) -> list[str]:
        if any(not s for s in v):
            raise ValueError("stop strings must be non-empty")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v < -1:
            raise ValueError(f"top_k must be >= 1, or -1 or 0 to disable it, got {v}")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[int, float]) -> dict[int, float]:
        bad = {k: b for k, b in v.items() if not -100.0 <= b <= 100.0 or k < 0}
        if bad:
            raise ValueError(f"logit_bias needs token ids >= 0 and biases in [-100, 100], got {bad}")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: list[int]) -> list[int]:
        if any(t < 0 for t in v):
            raise ValueError("stop_token_ids must be >= 0")
        return v

    @model_validator(mode="after")
    def _structured_ends_itself(self) -> SamplingParams:
        if self.structured_outputs is not None and self.min_tokens:
            raise ValueError("min_tokens cannot be combined with structured_outputs: the constraint decides "
                             "where the output ends")
        return self

    @model_validator(mode="after")
    def _min_le_max(self) -> SamplingParams:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) > max_tokens ({self.max_tokens})")
        return self

    @cached_property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @cached_property  # read per token by the scheduler: computed once
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @cached_property  # read per sampled row by the sampler: computed once
    def sampler_row(self) -> tuple[tuple[float, ...], bool]:
        """The sampler's per-row values (sampler._DENSE order; top_k 0 when off, presence and frequency
        as for a row with generated tokens) and whether a row also needs its per-row part (a bias, a
        min_tokens ban, penalties or logprobs)."""
        drawn = not self.greedy
        counted = bool(self.presence_penalty or self.frequency_penalty)
        repeated = self.repetition_penalty != 1.0
        row = (
            self.temperature if drawn else 1.0, self.top_p, self.min_p,
            self.presence_penalty if counted else 0.0, self.frequency_penalty if counted else 0.0,
            self.repetition_penalty if repeated else 1.0, float(max(self.top_k, 0)), float(not drawn),
            float(drawn and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)),
        )
        special = self.logit_bias or self.min_tokens or self.has_penalties or self.logprobs is not None
        return row, bool(special)

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the params mention must exist in the model's vocabulary."""
        ids = [*self.logit_bias, *self.stop_token_ids]
        bad = [t for t in ids if t >= vocab_size]
        if bad:
            raise ValueError(f"token ids {bad} in sampling params are >= vocab_size {vocab_size}")
