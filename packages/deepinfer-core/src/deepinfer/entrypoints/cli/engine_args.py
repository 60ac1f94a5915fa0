"""Command-line options shared by `generate`, `chat` and `bench`: model/engine and sampling settings."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from deepinfer.engine.loader import DTYPES
from deepinfer.sampling import SamplingParams

if TYPE_CHECKING:
    from deepinfer.entrypoints.llm import LLM


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and engine")
    g.add_argument("--model", required=True,
                   help="checkpoint directory (config.json, safetensors, tokenizer.json); "
                   "scripts/demo.sh builds the tiny default at checkpoints/tiny-default")
    g.add_argument("--backend", default=None,
                   help="op backend (default: $DEEPINFER_BACKEND or the best installed)")
    g.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="compute dtype")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per sequence")
    g.add_argument("--max-num-seqs", type=int, default=256, help="sequences running at once")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="GPU memory share")
    g.add_argument("--cache-mb", type=int, default=None, help="cache budget in MiB (CPU default: 256)")
    g.add_argument("--sync", action="store_true", help="disable asynchronous scheduling")
    g.add_argument("--seed", type=int, default=0, help="engine seed for requests without --sampling-seed")


def llm_from_args(args: argparse.Namespace) -> LLM:
    from deepinfer.entrypoints.llm import LLM

    return LLM(args.model, backend=args.backend, dtype=args.dtype, device=args.device,
               max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens,
               gpu_memory_utilization=args.gpu_memory_utilization,
               cache_bytes=args.cache_mb << 20 if args.cache_mb else None,
               async_scheduling=not args.sync, seed=args.seed)


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int = 32) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens)
    g.add_argument("--min-tokens", type=int, default=0)
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--stop-token-ids", type=parse_ids, default=[], help="comma-separated token ids")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--n", type=int, default=1, help="completions per prompt")
    g.add_argument("--logprobs", type=int, default=None, help="top-k log-probabilities per output token")
    g.add_argument("--sampling-seed", type=int, default=None, help="seed of every request (deterministic)")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty, stop=args.stop,
        stop_token_ids=args.stop_token_ids, ignore_eos=args.ignore_eos, n=args.n, logprobs=args.logprobs,
        seed=args.sampling_seed)


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
