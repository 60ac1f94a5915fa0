"""Command-line options shared by `generate`, `chat` and `bench`: model/engine and sampling settings."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import pydantic

from deepinfer.engine.loader import DTYPES, LOAD_FORMATS
from deepinfer.entrypoints.cli.errors import (
    UsageError,
    finite_float,
    non_negative_int,
    positive_int,
    usage_errors,
)
from deepinfer.sampling import SamplingParams

if TYPE_CHECKING:
    from deepinfer.entrypoints.llm import LLM

# EngineConfig fields whose option is not simply --field-name
ENGINE_FLAGS = {"cache_bytes": "--cache-mb", "async_scheduling": "--sync"}
SAMPLING_FLAGS = {"seed": "--sampling-seed"}


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """Options of the model runtime itself (also used by `score`)."""
    g = parser.add_argument_group("model runtime")
    g.add_argument("--cache-precision", choices=["release", "exact"], default=None,
                   help="KV cache storage: release = the official engine's FP8/FP4 cache (what makes the "
                   "real model fit), exact = the compute dtype (parity work) "
                   "(default: release on CUDA, exact elsewhere)")
    g.add_argument("--replay-mode", choices=["off", "mask", "compact"], default="off",
                   help="SWA bounded replay for the YOCO consumer layers: mask hides window keys before "
                   "the kept suffix, compact also skips computing those rows")
    g.add_argument("--replay-keep", type=positive_int, default=None, metavar="N",
                   help="positions bounded replay keeps, at least sliding_window + the rollback depth "
                   "(default: 140)")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and engine")
    g.add_argument("--model", required=True,
                   help="checkpoint directory (config.json, safetensors, tokenizer.json; no safetensors "
                   "with --load-format dummy); "
                   "the trained default model is checkpoints/tiny-stdlib (tracked in the repo)")
    g.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                   help="auto: read the checkpoint's safetensors; dummy: no weights on disk, random ones "
                   "(drawn from --seed) generated in memory in the release storage formats from config.json "
                   "(FP8 blocks, packed FP4 experts), for benchmarks: --model then needs only config.json "
                   "(tokenizer.json for text prompts; `deepinfer make-checkpoint --config-only` writes both)")
    g.add_argument("--backend", default=None,
                   help="op backend (default: $DEEPINFER_BACKEND or the best installed)")
    g.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto",
                   help="compute dtype; auto = the checkpoint's dtype on a GPU, float32 on the CPU")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--max-model-len", type=positive_int, default=None,
                   help="prompt + output tokens per sequence, at most the model's max_position_embeddings "
                   "(default: the smaller of that and 4096)")
    g.add_argument("--max-num-seqs", type=positive_int, default=256, help="sequences running at once")
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="token budget per step (default: max(2048, --max-num-seqs))")
    g.add_argument("--gpu-memory-utilization", type=finite_float, default=0.9,
                   help="share of GPU memory the engine may use, in (0, 1]")
    g.add_argument("--cache-mb", type=positive_int, default=None,
                   help="cache budget in MiB (default: what --gpu-memory-utilization leaves on a GPU, "
                   "256 on the CPU)")
    g.add_argument("--sync", action="store_true", help="disable asynchronous scheduling")
    g.add_argument("--enforce-eager", action="store_true",
                   help="run every step eagerly (default on CUDA: decode, verification and draft steps "
                        "replay CUDA graphs captured at start-up)")
    g.add_argument("--cuda-graph-sizes", type=positive_int, nargs="+", default=None, metavar="N",
                   help="batch sizes to capture CUDA graphs for, e.g. 1 8 64: a batch pads up to the next "
                   "size, batches above the largest run eagerly; fewer sizes, faster start-up (default: "
                   "1 2 4 8 16 24 32 48 64 96 128 160 192 224 256 up to --max-num-seqs)")
    g.add_argument("--batch-invariant", action="store_true",
                   help="batch-invariant kernels: a sequence's logits are bitwise the same alone or in any "
                   "batch, across runs (costs some speed; docs/performance.md)")
    g.add_argument("--seed", type=non_negative_int, default=0,
                   help="engine seed: each request without --sampling-seed draws its own seed from it, "
                   "so a whole run is reproducible; with --load-format dummy it also seeds the weights")
    g.add_argument("--speculator", default="none",
                   help="speculative decoding: dspark (the checkpoint's draft blocks), ngram (prompt lookup) "
                   "or none; any plugin installed under the deepinfer.speculators entry points")
    g.add_argument("--num-draft-tokens", type=positive_int, default=None, metavar="K",
                   help="most drafts verified per sequence and step (default: the speculator's; "
                   "dspark: the checkpoint's draft block size)")
    g.add_argument("--spec-schedule", choices=["fixed", "confidence"], default="fixed",
                   help="fixed: verify every draft; confidence: choose each step's verified drafts from the "
                   "draft confidences and the measured step latency (with async scheduling the step's total "
                   "is chosen on the host, its split among the sequences on the device from the newest "
                   "confidences)")
    add_runtime_args(parser)


def llm_from_args(args: argparse.Namespace) -> LLM:
    """The `LLM` the options describe; an option out of range is a UsageError naming it."""
    from deepinfer.entrypoints.llm import LLM, SettingError

    engine = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                  gpu_memory_utilization=args.gpu_memory_utilization,
                  cache_bytes=args.cache_mb << 20 if args.cache_mb is not None else None,
                  async_scheduling=not args.sync, seed=args.seed, enforce_eager=args.enforce_eager,
                  cuda_graph_sizes=args.cuda_graph_sizes,
                  batch_invariant=args.batch_invariant,
                  speculator=args.speculator,
                  num_draft_tokens=args.num_draft_tokens, spec_schedule=args.spec_schedule,
                  load_format=args.load_format)
    kwargs = dict(backend=args.backend, dtype=args.dtype, device=args.device,
                  max_model_len=args.max_model_len, cache_precision=args.cache_precision,
                  replay_mode=args.replay_mode, replay_keep=args.replay_keep, **engine)
    if getattr(args, "dp", 1) > 1:  # generate --dp: ranks of deepinfer.distributed
        if args.load_format == "dummy":
            raise UsageError("--load-format dummy: not supported with --dp yet (each rank loads only its "
                             "shard of the experts and Engram rows)")
        from deepinfer.distributed.cli import data_parallel_llm

        return data_parallel_llm(args, kwargs)  # type: ignore[return-value]
    try:
        return LLM(args.model, **kwargs)
    except SettingError as exc:
        raise UsageError(option_names(str(exc))) from None


def option_names(message: str) -> str:
    """`max_model_len: ...` -> `--max-model-len: ...` (LLM's messages name its keyword arguments)."""
    parts = []
    for part in message.split("; "):
        field, sep, rest = part.partition(": ")
        if sep and field.isidentifier():
            field = ENGINE_FLAGS.get(field, "--" + field.replace("_", "-"))
        parts.append(field + sep + rest)
    return "; ".join(parts)


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int = 32) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens, help="most tokens generated per completion")
    g.add_argument("--min-tokens", type=int, default=0, help="EOS and --stop-token-ids are masked until then")
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=-1,
                   help="keep the k most likely tokens; -1 or 0 disables")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: smallest set with this mass")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top probability")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2]")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2]")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="in (0, 10]; 1 = off")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--stop-token-ids", type=parse_ids, default=[], help="comma-separated token ids")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating after EOS")
    g.add_argument("--n", type=int, default=1, help="completions per prompt")
    g.add_argument("--logprobs", type=int, default=None, help="top-k log-probabilities per output token")
    g.add_argument("--sampling-seed", type=int, default=None,
                   help="the same seed for every request: each samples the same tokens whatever else runs "
                   "(default: one drawn from --seed per request)")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty,
            stop=args.stop, stop_token_ids=args.stop_token_ids, ignore_eos=args.ignore_eos, n=args.n,
            logprobs=args.logprobs, seed=args.sampling_seed)
    except pydantic.ValidationError as exc:
        raise usage_errors(exc, SAMPLING_FLAGS) from None


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
