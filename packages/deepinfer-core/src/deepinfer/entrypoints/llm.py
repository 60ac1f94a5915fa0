"""`LLM`: the offline API — load a checkpoint, generate for many prompts, stream, chat."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import pydantic
import torch
from tqdm import tqdm

from deepinfer.cache.layout import CachePrecision
from deepinfer.config import load_model_config
from deepinfer.config.errors import config_error_from
from deepinfer.engine import EngineConfig, LLMEngine, RequestOutput
from deepinfer.engine.llm_engine import check_text
from deepinfer.engine.loader import TextTokenizer, default_cache_precision, load_model, resolve_dtype
from deepinfer.sampling import SamplingParams
from deepinfer.speculators import SpeculatorError

if TYPE_CHECKING:
    from deepinfer.models.deepseek_v41.runtime import RuntimeOptions

logger = logging.getLogger(__name__)

RECIPE_MODEL_NAME = "DeepSeek-V4.1-Flash"
RECIPE_HINT = "LLM.chat needs deepseek_recipe: pip install 'deepinfer-core[serve]'"

Prompt = str | list[int]
ENGINE_ONLY_REASONS = ("prompt_length_exceeded", "abort", "error")  # finished without the model's say
ParamsArg = SamplingParams | dict | Sequence[SamplingParams | dict] | None


class SettingError(ValueError):
    """An `LLM(...)` argument is out of range; the message starts with the argument's name."""


@dataclass
class ChatOutput:
    """A parsed assistant turn: reasoning, content and tool calls, plus the raw generation."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[dict[str, Any]]
    # the protocol's ("stop", "length", "tool_calls"), or the engine's when nothing was generated
    # ("prompt_length_exceeded", "abort", "error")
    finish_reason: str | None
    output: RequestOutput


class LLM:
    """Offline inference on one device.

    `LLM(model="checkpoints/tiny-stdlib")` loads the checkpoint directory (config.json, safetensors,
    tokenizer.json), sizes the cache from the memory budget and starts an `LLMEngine`. Extra keyword
    arguments are `EngineConfig` fields (max_num_seqs, max_num_batched_tokens, async_scheduling, ...).

    `dtype="auto"` computes in the checkpoint's dtype on a GPU and in float32 on the CPU.
    `cache_precision` is "release" (the official FP8/FP4 cache) by default on CUDA and "exact" (the
    compute dtype, for parity work) elsewhere. `replay_mode` "mask" / "compact" turns on SWA bounded
    replay for the YOCO consumer layers, keeping the last `replay_keep` positions (at least
    sliding_window + the rollback depth; the runtime checks both rules at the first step).

    `load_format="dummy"` (like vLLM's) needs only config.json (and tokenizer.json for text prompts):
    seeded random weights (from `seed`) in the release storage formats, for benchmarks.

    Every call leaves the engine as it found it: a call that fails, is interrupted (Ctrl-C) or whose
    iterator is abandoned aborts the requests it submitted.
    """

    def __init__(self, model: str | Path, *, tokenizer: str | Path | None = None, backend: str | None = None,
                 dtype: str = "auto", device: str | None = None, max_model_len: int | None = None,
                 cache_precision: str | None = None, replay_mode: str = "off", replay_keep: int | None = None,
                 **engine_kwargs: Any):
        self.model_dir = Path(model)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model_config = load_model_config(self.model_dir)  # names the bad key of a broken config.json
        max_pos = model_config.text.max_position_embeddings
        if max_model_len is None:
            max_model_len = min(4096, max_pos)
        elif isinstance(max_model_len, int) and max_model_len > max_pos:
            raise SettingError(f"max_model_len: {max_model_len} exceeds the model's "
                               f"max_position_embeddings {max_pos}")
        try:  # every setting is checked before the (slow) load
            config = EngineConfig(max_model_len=max_model_len, **engine_kwargs)
        except pydantic.ValidationError as exc:
            raise SettingError(str(config_error_from(exc))) from None
        precision = cache_precision or default_cache_precision(device)
        options = runtime_options(precision, replay_mode, replay_keep)
        sizes = config.cuda_graph_sizes
        options = replace(options, cuda_graphs=not config.enforce_eager,
                          cuda_graph_sizes=tuple(sizes) if sizes is not None else None,
                          batch_invariant=config.batch_invariant)
        if config.speculator != "none":  # room to roll back rejected drafts
            options = replace(options, max_backtrack=rollback_room(model_config.text.dspark_block_size,
                                                                   config.num_draft_tokens))
        try:
            compute_dtype = resolve_dtype(dtype, device, model_config.dtype)
        except ValueError as exc:
            raise SettingError(f"dtype: {exc}") from None
        tokenizer_dir = Path(tokenizer or self.model_dir)
        text_tokenizer = None
        if (tokenizer_dir / "tokenizer.json").exists():
            text_tokenizer = load_tokenizer(tokenizer_dir)
        else:
            logger.warning("no tokenizer.json in %s: prompts must be token ids, outputs have no text",
                           tokenizer_dir)
        runtime = load_model(self.model_dir, backend=backend, dtype=compute_dtype, device=device,
                             load_format=config.load_format, seed=config.seed, options=options)
        try:
            engine = LLMEngine(runtime, text_tokenizer, config, device)
        except SpeculatorError as exc:
            raise SettingError(f"speculator: {exc}") from None
        self._attach(engine, text_tokenizer)

    @classmethod
    def from_engine(cls, engine: LLMEngine, model_dir: str | Path | None = None) -> LLM:
        """An `LLM` over an engine built elsewhere (e.g. around a custom `CausalLM`); `chat` needs a
        `model_dir` holding tokenizer.json."""
        llm = cls.__new__(cls)
        llm.model_dir = Path(model_dir) if model_dir is not None else Path()
        llm._attach(engine, engine.tokenizer)  # type: ignore[arg-type]
        return llm

    def _attach(self, engine: LLMEngine, tokenizer: TextTokenizer | None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self._recipe_encoding: Any = None
        # request id -> the outputs queue of the call that submitted it: a call stepping the engine
        # hands other live calls' outputs over instead of dropping them (interleaved streams)
        self._routes: dict[str, deque[RequestOutput]] = {}

    # ---- generation -----------------------------------------------------------------------------

    def _submit(self, prompts: Prompt | Sequence[Prompt] | None, sampling_params: ParamsArg,
                prompt_token_ids: Sequence[list[int]] | None, stream: bool, ids: list[str]) -> None:
        """Validate every request first (a malformed one raises before any is queued), then queue all,
        adding their ids to `ids` as they are queued (the caller aborts them if anything goes wrong)."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass exactly one of prompts and prompt_token_ids")
        items: list[Prompt] = (list(prompt_token_ids) if prompt_token_ids is not None
                               else [prompts] if isinstance(prompts, str) else list(prompts))  # type: ignore
        if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
            if len(sampling_params) != len(items):
                raise ValueError(f"{len(sampling_params)} sampling params for {len(items)} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params] * len(items)
        prepared = [self.engine.prepare_request(item, p) for item, p in zip(items, params)]
        self.engine.add_prepared(prepared, stream=stream, added=ids)

    def _follow(self, ids: list[str], finished: set[str]) -> Iterator[RequestOutput]:
        """Step the engine until the requests `ids` are all in `finished`, yielding their outputs in
        step order."""
        box: deque[RequestOutput] = deque()
        self._routes.update(dict.fromkeys(ids, box))
        try:
            while len(finished) < len(ids):
                while box:
                    out = box.popleft()
                    if out.finished:
                        finished.add(out.request_id)
                    yield out
                if len(finished) == len(ids):
                    break
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError(f"the engine lost requests {sorted(set(ids) - finished)}")
                for out in self.engine.step():
                    route = self._routes.get(out.request_id)
                    if route is not None:  # not one of this LLM's calls: not ours to take
                        route.append(out)
        finally:
            for i in ids:
                self._routes.pop(i, None)

    def _abort_unfinished(self, ids: list[str], finished: set[str]) -> None:
        """A call ended early (an error, Ctrl-C, an abandoned iterator): its requests are unwanted."""
        if len(finished) < len(ids):
            self.engine.abort([i for i in ids if i not in finished], report=False)

    def generate(self, prompts: Prompt | Sequence[Prompt] | None = None, sampling_params: ParamsArg = None,
                 prompt_token_ids: Sequence[list[int]] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run to completion; one output per prompt, in submission order."""
        ids: list[str] = []
        finished: set[str] = set()
        done: dict[str, RequestOutput] = {}
        try:
            self._submit(prompts, sampling_params, prompt_token_ids, False, ids)
            start, generated = time.perf_counter(), 0
            with tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm,
                      dynamic_ncols=True) as bar:
                for out in self._follow(ids, finished):
                    done[out.request_id] = out
                    generated += sum(len(c.token_ids) for c in out.outputs)
                    bar.update(1)
                    bar.set_postfix_str(f"{generated / (time.perf_counter() - start):.1f} tok/s")
        finally:
            self._abort_unfinished(ids, finished)
        return [done[i] for i in ids]

    def generate_stream(self, prompts: Prompt | Sequence[Prompt] | None = None,
                        sampling_params: ParamsArg = None,
                        prompt_token_ids: Sequence[list[int]] | None = None) -> Iterator[RequestOutput]:
        """Yield outputs as tokens arrive: each holds only the new text and token ids of a request.

        Requests are queued at the first `next()`; closing the iterator (or dropping it) aborts them.
        """
        ids: list[str] = []
        finished: set[str] = set()
        try:
            self._submit(prompts, sampling_params, prompt_token_ids, True, ids)
            yield from self._follow(ids, finished)
        finally:
            self._abort_unfinished(ids, finished)

    # ---- chat -----------------------------------------------------------------------------------

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: ParamsArg = None, *,
             thinking: bool = False, reasoning_effort: str | None = None, tools: list[dict] | None = None,
             use_tqdm: bool = True) -> list[ChatOutput]:
        """Chat Completions-style messages (one conversation, or a list of them) -> parsed replies.

        The prompt is rendered in the DeepSeek-V4.1 format by deepseek_recipe, and the generated tokens
        are parsed back into reasoning, content and tool calls by its StreamProcessor. A reply the
        engine did not generate (prompt too long, aborted, failed) carries the engine's finish reason
        and no content.
        """
        recipe = _import_recipe()
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        rendered = [self._render(recipe, c, thinking, reasoning_effort, tools) for c in conversations]
        outputs = self.generate(prompt_token_ids=[p for _, p in rendered], sampling_params=sampling_params,
                                use_tqdm=use_tqdm)
        results = []
        for (request, prompt), out in zip(rendered, outputs):
            completion = out.outputs[0]
            if completion.finish_reason in ENGINE_ONLY_REASONS:
                results.append(ChatOutput(None, None, [], completion.finish_reason, out))
                continue
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
        (`{"content": ...}`, `{"reasoning_content": ...}`, `{"tool_calls": [...]}`, then `finish_reason`,
        which is the engine's when it generated nothing: "prompt_length_exceeded", "abort", "error").
        Closing (or dropping) the iterator aborts the request."""
        recipe = _import_recipe()
        request, prompt = self._render(recipe, messages, thinking, reasoning_effort, tools)
        proc, _ = self._parser(recipe, request, len(prompt), "stream")
        stream = self.generate_stream(prompt_token_ids=[prompt], sampling_params=sampling_params)
        with closing(stream):
            for out in stream:
                completion = out.outputs[0]
                if completion.finish_reason in ENGINE_ONLY_REASONS:
                    yield {"finish_reason": completion.finish_reason}
                    return
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
        try:
            request = recipe.ChatCompletionRequest(request_json(body)).convert(recipe.ConversionOptions())
        except recipe.ConversionError as exc:  # not a ValueError subclass, but a bad request all the same
            raise ValueError(f"chat request: {exc}") from None
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


def request_json(body: dict[str, Any]) -> str:
    """A chat request as JSON text: the recipe's JSON parser bounds nesting depth, and cycles,
    undecodable text and non-JSON values are caught here with a message naming them."""
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise ValueError("chat request: nested too deeply") from None
    except (TypeError, ValueError) as exc:  # a cycle, NaN, or a value JSON cannot hold
        raise ValueError(f"chat request: not representable as JSON ({exc})") from None
    return check_text(text, "chat request")


def runtime_options(cache_precision: str, replay_mode: str, replay_keep: int | None) -> RuntimeOptions:
    """The model runtime's options, each checked against its allowed values."""
    from deepinfer.models.deepseek_v41.runtime import RuntimeOptions
    from deepinfer.models.deepseek_v41.step_state import ReplayMode

    if cache_precision not in get_args(CachePrecision):
        raise SettingError(f"cache_precision: must be one of {get_args(CachePrecision)}, "
                           f"got {cache_precision!r}")
    if replay_mode not in get_args(ReplayMode):
        raise SettingError(f"replay_mode: must be one of {get_args(ReplayMode)}, got {replay_mode!r}")
    if replay_keep is None:
        return RuntimeOptions(cache_precision=cache_precision, replay_mode=replay_mode)  # type: ignore[arg-type]
    if isinstance(replay_keep, bool) or not isinstance(replay_keep, int) or replay_keep < 1:
        raise SettingError(f"replay_keep: must be a positive number of positions, got {replay_keep!r}")
    if replay_mode == "off":
        raise SettingError("replay_keep: needs replay_mode mask or compact")
    return RuntimeOptions(cache_precision=cache_precision, replay_mode=replay_mode,  # type: ignore[arg-type]
                          replay_keep=replay_keep)


DEFAULT_ROLLBACK_ROOM = 8  # tokens, when num_draft_tokens is left to the speculator


def rollback_room(dspark_block_size: int | None, num_draft_tokens: int | None) -> int:
    """Rollback depth the runtime keeps for speculation: the drafts verified per step, at least the
    DSpark default (block size + 1)."""
    return max(num_draft_tokens or DEFAULT_ROLLBACK_ROOM, (dspark_block_size or 0) + 1)


def load_tokenizer(model_dir: Path) -> TextTokenizer:
    try:
        return TextTokenizer.from_dir(model_dir)
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ValueError(f"{model_dir / 'tokenizer.json'}: cannot load the tokenizer ({exc})") from None


def _import_recipe() -> Any:
    try:
        import deepseek_recipe
    except ImportError as exc:
        raise ImportError(RECIPE_HINT) from exc
    if not hasattr(deepseek_recipe, "DeepseekV41Encoding"):  # the package is there but not built
        raise ImportError(f"{RECIPE_HINT} (the installed deepseek_recipe lacks DeepseekV41Encoding)")
    return deepseek_recipe
