"""The engine: requests and sequences, scheduler, cache manager, model runner, async step loop."""

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.llm_engine import LLMEngine
from deepinfer.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from deepinfer.engine.sequence import FinishReason

__all__ = ["CompletionOutput", "EngineConfig", "FinishReason", "LLMEngine", "RequestMetrics", "RequestOutput"]
