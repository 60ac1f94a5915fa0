"""`EngineConfig`: batch limits, memory budget and scheduling mode, validated at the boundary."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# like vLLM's --load-format: auto = the checkpoint's safetensors, dummy = random weights from config.json
LoadFormat = Literal["auto", "dummy"]


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_model_len: int = Field(4096, ge=2, description="prompt + output tokens per sequence")
    max_num_seqs: int = Field(256, ge=1, description="sequences running at once")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="tokens per step (prefill chunks + decodes); None: max(2048, max_num_seqs)")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="GPU: share of device memory")
    cache_bytes: int | None = Field(
        None, ge=1, description="explicit cache budget in bytes (default on CPU: 256 MiB)")
    async_scheduling: bool = Field(True, description="overlap CPU scheduling with the device step")
    watermark: float = Field(0.01, ge=0.0, lt=1.0, description="share of blocks kept free at admission")
    seed: int = Field(0, ge=0, description="seeds requests that give no seed (and dummy weights), for "
                      "reproducible runs")
    log_stats_interval: float = Field(10.0, ge=0.0, description="seconds between stats logs; 0: off")
    enforce_eager: bool = Field(False, description="CUDA: run every step eagerly (no CUDA graphs)")
    cuda_graph_sizes: list[int] | None = Field(
        None, description="CUDA: batch sizes to capture graphs for (a batch pads up to the next one, larger "
        "batches run eagerly); None: 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, ..., 256 up to max_num_seqs")
    batch_invariant: bool = Field(
        False, description="a sequence's logits bitwise the same alone or in any batch (fixed kernels)")
    speculator: str = Field("none", min_length=1,
                            description="speculative decoding plugin (deepinfer.speculators), or none")
    num_draft_tokens: int | None = Field(
        None, ge=1, le=16, description="most drafts verified per sequence and step; None: the speculator's")
    spec_schedule: Literal["fixed", "confidence"] = Field(
        "fixed", description="fixed: verify every draft; confidence: choose per step from the confidences")
    load_format: LoadFormat = Field(
        "auto", description="auto: the checkpoint's safetensors; dummy: random weights (drawn from `seed`) "
        "in the storage formats, from config.json alone (benchmarks)")

    @model_validator(mode="after")
    def _token_budget(self) -> EngineConfig:
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(2048, self.max_num_seqs)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({self.max_num_seqs}) so every running sequence can decode")
        return self

    @model_validator(mode="after")
    def _graph_sizes(self) -> EngineConfig:
        sizes = self.cuda_graph_sizes
        if sizes is not None:
            if not sizes:
                raise ValueError("cuda_graph_sizes: give at least one batch size (enforce_eager turns "
                                 "graphs off)")
            bad = [s for s in sizes if not 1 <= s <= self.max_num_seqs]
            if bad:
                raise ValueError(f"cuda_graph_sizes: {bad} not in [1, max_num_seqs = {self.max_num_seqs}]")
        return self

    @property
    def token_budget(self) -> int:
        assert self.max_num_batched_tokens is not None
        return self.max_num_batched_tokens
