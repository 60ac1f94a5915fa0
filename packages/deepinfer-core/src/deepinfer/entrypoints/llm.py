"""`LLM`: the offline API — load a checkpoint, generate for many prompts, stream, chat."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from deepinfer.engine import EngineConfig, LLMEngine, RequestOutput
from deepinfer.engine.loader import TextTokenizer, load_model
from deepinfer.sampling import SamplingParams

logger = logging.getLogger(__name__)

RECIPE_MODEL_NAME = "DeepSeek-V4.1-Flash"
RECIPE_HINT = "LLM.chat needs deepseek_recipe: pip install 'deepinfer-core[serve]'"

Prompt = str | list[int]
ParamsArg = SamplingParams | dict | Sequence[SamplingParams | dict] | None


@dataclass
class ChatOutput:
    """A parsed assistant turn: reasoning, content and tool calls, plus the raw generation."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None  # the protocol's ("stop", "length", "tool_calls")
    output: RequestOutput


class LLM:
    """Offline inference on one device.

    `LLM(model="checkpoints/tiny-default")` loads the checkpoint directory (config.json, safetensors,
    tokenizer.json), sizes the cache from the memory budget and starts an `LLMEngine`. Extra keyword
    arguments are `EngineConfig` fields (max_num_seqs, max_num_batched_tokens, async_scheduling, ...).
    """

    def __init__(self, model: str | Path, *, tokenizer: str | Path | None = None, backend: str | None = None,
                 dtype: str = "float32", device: str | None = None, max_model_len: int | None = None,
                 **engine_kwargs: Any):
        self.model_dir = Path(model)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer_dir = Path(tokenizer or self.model_dir)
        self.tokenizer = None
        if (tokenizer_dir / "tokenizer.json").exists():
            self.tokenizer = TextTokenizer.from_dir(tokenizer_dir)
        else:
            logger.warning("no tokenizer.json in %s: prompts must be token ids, outputs have no text",
                           tokenizer_dir)
        runtime = load_model(self.model_dir, backend=backend, dtype=dtype, device=device)
        if max_model_len is None:
            hf = json.loads((self.model_dir / "config.json").read_text())
            max_model_len = min(4096, int(hf.get("max_position_embeddings", 4096)))
        config = EngineConfig(max_model_len=max_model_len, **engine_kwargs)
        self.engine = LLMEngine(runtime, self.tokenizer, config, device)
        self._recipe_encoding: Any = None

    # ---- generation -----------------------------------------------------------------------------

    def _submit(self, prompts: Prompt | Sequence[Prompt] | None, sampling_params: ParamsArg,
                prompt_token_ids: Sequence[list[int]] | None, stream: bool) -> list[str]:
        """Validate every request first (a malformed one raises before any work), then queue all."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass exactly one of prompts and prompt_token_ids")
        items: list[Prompt] = (list(prompt_token_ids) if prompt_token_ids is not None
                               else [prompts] if isinstance(prompts, str) else list(prompts))  # type: ignore
        if isinstance(sampling_params, Sequence):
            if len(sampling_params) != len(items):
                raise ValueError(f"{len(sampling_params)} sampling params for {len(items)} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params] * len(items)
        params = [p if isinstance(p, SamplingParams) else SamplingParams.model_validate(p or {})
                  for p in params]
        for p in params:
            p.check_vocab(self.engine.vocab_size)
        return [self.engine.add_request(item, p, stream=stream) for item, p in zip(items, params)]

    def generate(self, prompts: Prompt | Sequence[Prompt] | None = None, sampling_params: ParamsArg = None,
                 prompt_token_ids: Sequence[list[int]] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run to completion; one output per prompt, in submission order."""
        ids = self._submit(prompts, sampling_params, prompt_token_ids, stream=False)
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        start, generated = time.perf_counter(), 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                done[out.request_id] = out
                generated += sum(len(c.token_ids) for c in out.outputs)
                bar.update(1)
                bar.set_postfix_str(f"{generated / (time.perf_counter() - start):.1f} tok/s")
        bar.close()
        return [done[i] for i in ids]

    def generate_stream(self, prompts: Prompt | Sequence[Prompt] | None = None,
                        sampling_params: ParamsArg = None,
                        prompt_token_ids: Sequence[list[int]] | None = None) -> Iterator[RequestOutput]:
        """Yield outputs as tokens arrive: each holds only the new text and token ids of a request."""
        self._submit(prompts, sampling_params, prompt_token_ids, stream=True)
        while self.engine.has_unfinished_requests():
            yield from self.engine.step()

    # ---- chat -----------------------------------------------------------------------------------

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: ParamsArg = None, *,
             thinking: bool = False, reasoning_effort: str | None = None, tools: list[dict] | None = None,
             use_tqdm: bool = True) -> list[ChatOutput]:
        """Chat Completions-style messages (one conversation, or a list of them) -> parsed replies.

        The prompt is rendered in the DeepSeek-V4.1 format by deepseek_recipe, and the generated tokens
        are parsed back into reasoning, content and tool calls by its StreamProcessor.
        """
        recipe = _import_recipe()
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        rendered = [self._render(recipe, c, thinking, reasoning_effort, tools) for c in conversations]
        outputs = self.generate(prompt_token_ids=[p for _, p in rendered], sampling_params=sampling_params,
                                use_tqdm=use_tqdm)
        results = []
        for (request, prompt), out in zip(rendered, outputs):
            completion = out.outputs[0]
            proc, response = self._parser(recipe, request, len(prompt), out.request_id)
            events = self._token_events(recipe, proc, completion.token_ids)
            events += self._finish_events(recipe, proc, completion.finish_reason)
            for event in events:
                response.accumulate(event)
            choice = json.loads(response.to_json())["choices"][0]
            message = choice["message"]
            results.append(ChatOutput(message.get("content"), message.get("reasoning_content"),
                                      message.get("tool_calls") or [], choice.get("finish_reason"), out))
        return results

    def chat_stream(self, messages: list[dict], sampling_params: SamplingParams | dict | None = None, *,
                    thinking: bool = False, reasoning_effort: str | None = None,
                    tools: list[dict] | None = None) -> Iterator[dict[str, Any]]:
        """Stream one conversation's reply as Chat Completions chunk deltas
        (`{"content": ...}`, `{"reasoning_content": ...}`, `{"tool_calls": [...]}`, then `finish_reason`)."""
        recipe = _import_recipe()
        request, prompt = self._render(recipe, messages, thinking, reasoning_effort, tools)
        proc, _ = self._parser(recipe, request, len(prompt), "stream")
        for out in self.generate_stream(prompt_token_ids=[prompt], sampling_params=sampling_params):
            completion = out.outputs[0]
            events = self._token_events(recipe, proc, completion.token_ids)
            if out.finished:
                events += self._finish_events(recipe, proc, completion.finish_reason)
            for event in events:
                for choice in json.loads(event.to_json()).get("choices", []):
                    delta = {k: v for k, v in choice.get("delta", {}).items() if v not in (None, "")}
                    if choice.get("finish_reason"):
                        delta["finish_reason"] = choice["finish_reason"]
                    if delta.keys() - {"role"}:
                        yield delta

    def _render(self, recipe: Any, messages: list[dict], thinking: bool, effort: str | None,
                tools: list[dict] | None) -> tuple[Any, list[int]]:
        body: dict[str, Any] = {"model": RECIPE_MODEL_NAME, "messages": messages,
                                "thinking": {"type": "enabled" if thinking else "disabled"}}
        if effort:
            body["reasoning_effort"] = effort
        if tools:
            body["tools"] = tools
        request = recipe.ChatCompletionRequest(body).convert(recipe.ConversionOptions())
        if self._recipe_encoding is None:  # with_tokenizer copies the tokenizer: do it once
            self._recipe_tokenizer = recipe.Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
            self._recipe_encoding = recipe.DeepseekV41Encoding().with_tokenizer(self._recipe_tokenizer)
        return request, list(self._recipe_encoding.encode(request.conversation))

    def _parser(self, recipe: Any, request: Any, prompt_len: int, request_id: str) -> tuple[Any, Any]:
        rid = f"chatcmpl-{request_id}"
        gen = recipe.ChatCompletionRequest.chunk_generator(request, rid, RECIPE_MODEL_NAME)
        proc = recipe.StreamProcessor(gen, request.parsing_options, self._recipe_tokenizer)
        response = recipe.ChatCompletionResponse(rid, RECIPE_MODEL_NAME, int(time.time()), prompt_len, 0)
        for event in proc.push(recipe.InferenceChunk.ready(prompt_usage=recipe.PromptUsage(
                prompt_tokens=prompt_len))):
            response.accumulate(event)
        return proc, response

    @staticmethod
    def _token_events(recipe: Any, proc: Any, token_ids: list[int]) -> list[Any]:
        return proc.push(recipe.InferenceChunk.tokens(token_ids)) if token_ids else []

    @staticmethod
    def _finish_events(recipe: Any, proc: Any, finish_reason: str | None) -> list[Any]:
        reason = (recipe.InferenceFinishReason.Length if finish_reason == "length"
                  else recipe.InferenceFinishReason.Stop)
        return [*proc.push(recipe.InferenceChunk.finish(reason)), *proc.finish()]

    def close(self) -> None:
        self.engine.close()


def _import_recipe() -> Any:
    try:
        import deepseek_recipe
    except ImportError as exc:
        raise ImportError(RECIPE_HINT) from exc
    if not hasattr(deepseek_recipe, "DeepseekV41Encoding"):  # the package is there but not built
        raise ImportError(f"{RECIPE_HINT} (the installed deepseek_recipe lacks DeepseekV41Encoding)")
    return deepseek_recipe
