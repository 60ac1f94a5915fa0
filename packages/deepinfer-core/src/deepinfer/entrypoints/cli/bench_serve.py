"""`deepinfer bench serve`: load a running server through the real `openai` client and report latency.

Requests stream (usage in the last chunk) so every one yields TTFT (first text or reasoning), the gaps
between chunks (ITL; one chunk may carry several tokens), TPOT = (E2E - TTFT) / (output tokens - 1) and
E2E. Arrivals are Poisson at --request-rate (inf: all at once), optionally capped at --max-concurrency
requests in flight. Goodput counts the requests per second that meet every --goodput SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from deepinfer.entrypoints.cli.errors import UsageError, positive_int

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "small", "model", "reads",
         "text", "and", "writes", "answer", "weather", "today", "is", "warm", "river", "by", "old", "mill")
METRICS = ("ttft", "tpot", "itl", "e2el")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench-serve", help="load a running server: TTFT/TPOT/ITL/E2E percentiles, throughput, goodput "
        "(also spelled `deepinfer bench serve`)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (without /v1)")
    parser.add_argument("--api-key", default=os.environ.get("DEEPINFER_API_KEY", "EMPTY"),
                        help="the server's --api-key (default: $DEEPINFER_API_KEY)")
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    parser.add_argument("--num-prompts", type=positive_int, default=100)
    parser.add_argument("--input-len", type=positive_int, default=128, help="prompt length in words")
    parser.add_argument("--output-len", type=positive_int, default=64, help="max_tokens (EOS ignored)")
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="mean arrivals per second, Poisson; inf = all at once")
    parser.add_argument("--max-concurrency", type=positive_int, default=None,
                        help="requests in flight at most")
    parser.add_argument("--thinking", action="store_true", help="thinking mode on (chat)")
    parser.add_argument("--goodput", nargs="+", default=[], metavar="METRIC:MS",
                        help="SLOs, e.g. ttft:500 tpot:50 e2el:10000 (milliseconds)")
    parser.add_argument("--percentiles", default="50,90,99", help="comma-separated percentiles to report")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (prompts, arrivals)")
    parser.add_argument("--json-out", default=None, help="write the results here as JSON")
    parser.set_defaults(func=run)


@dataclass
class Result:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def parse_slos(specs: list[str]) -> dict[str, float]:
    slos = {}
    for spec in specs:
        name, _, ms = spec.partition(":")
        try:
            value = float(ms)
        except ValueError:
            value = -1.0
        if name not in ("ttft", "tpot", "e2el") or value <= 0:
            raise UsageError(f"--goodput {spec!r}: expected ttft|tpot|e2el:MILLISECONDS (> 0)")
        slos[name] = value / 1000
    return slos


async def one_request(client: Any, args: argparse.Namespace, model: str, prompt: str) -> Result:
    start = time.perf_counter()
    first = last = None
    itl: list[float] = []
    usage = None
    try:
        common = dict(model=model, max_tokens=args.output_len, stream=True,
                      stream_options={"include_usage": True})
        if args.endpoint == "chat":
            thinking = {"type": "enabled" if args.thinking else "disabled"}
            stream = await client.chat.completions.create(
                messages=[{"role": "user", "content": prompt}], extra_body={"ignore_eos": True,
                                                                            "thinking": thinking}, **common)
        else:
            stream = await client.completions.create(prompt=prompt, extra_body={"ignore_eos": True}, **common)
        async for chunk in stream:
            usage = chunk.usage or usage
            if not chunk.choices or not _has_text(chunk.choices[0], args.endpoint):
                continue
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                itl.append(now - last)
            last = now
    except Exception as exc:  # a failed request is counted, not fatal
        return Result(False, error=f"{type(exc).__name__}: {exc}"[:200])
    end = time.perf_counter()
    if usage is None or first is None:
        return Result(False, error="no usage or no text in the stream")
    return Result(True, usage.prompt_tokens, usage.completion_tokens, first - start, end - start, itl)


def _has_text(choice: Any, endpoint: str) -> bool:
    if endpoint == "completions":
        return bool(choice.text)
    delta = choice.delta
    return bool(delta.content or getattr(delta, "reasoning_content", None) or delta.tool_calls)


async def run_load(args: argparse.Namespace) -> tuple[list[Result], float, str]:
    import httpx
    import openai

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    client = openai.AsyncOpenAI(base_url=f"{args.base_url.rstrip('/')}/v1", api_key=args.api_key,
                                max_retries=0, timeout=3600, http_client=httpx.AsyncClient(limits=limits))
    model = args.model or (await client.models.list()).data[0].id
    rng = random.Random(args.seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(args.input_len)) for _ in range(args.num_prompts)]
    gate = asyncio.Semaphore(args.max_concurrency or args.num_prompts)

    async def gated(prompt: str) -> Result:
        async with gate:
            return await one_request(client, args, model, prompt)

    tasks = []
    start = time.perf_counter()
    for prompt in prompts:
        tasks.append(asyncio.create_task(gated(prompt)))
        if math.isfinite(args.request_rate):
            await asyncio.sleep(rng.expovariate(args.request_rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    await client.close()
    return list(results), duration, model


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks."""
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(results: list[Result], duration: float, slos: dict[str, float],
              percentiles: list[float]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    summary: dict[str, Any] = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "concurrency": sum(r.e2el for r in ok) / duration,
        "errors": sorted({r.error for r in results if not r.ok})[:10],
    }
    series = {"ttft": [r.ttft for r in ok], "tpot": [t for r in ok if (t := r.tpot) is not None],
              "itl": [x for r in ok for x in r.itl], "e2el": [r.e2el for r in ok]}
    for name in METRICS:
        values = series[name]
        if not values:
            continue
        summary[f"mean_{name}_ms"] = 1000 * statistics.fmean(values)
        for p in percentiles:
            summary[f"p{p:g}_{name}_ms"] = 1000 * percentile(values, p)
    if slos:
        good = [r for r in ok if all((getattr(r, k) or 0.0) <= v for k, v in slos.items())]
        summary["goodput"] = len(good) / duration
        summary["slos_ms"] = {k: v * 1000 for k, v in slos.items()}
    return summary


def render(summary: dict[str, Any], percentiles: list[float]) -> str:
    rows = [("completed / failed", f"{summary['completed']} / {summary['failed']}"),
            ("duration (s)", f"{summary['duration_s']:.2f}"),
            ("request throughput (req/s)", f"{summary['request_throughput']:.2f}"),
            ("output throughput (tok/s)", f"{summary['output_throughput']:.1f}"),
            ("total throughput (tok/s)", f"{summary['total_token_throughput']:.1f}"),
            ("concurrency (mean in flight)", f"{summary['concurrency']:.2f}")]
    if "goodput" in summary:
        rows.append(("goodput (req/s)", f"{summary['goodput']:.2f}"))
    lines = [f"{k:<32}{v:>14}" for k, v in rows]
    header = f"{'latency (ms)':<14}{'mean':>10}" + "".join(f"{f'p{p:g}':>10}" for p in percentiles)
    lines += ["", header]
    for name in METRICS:
        if f"mean_{name}_ms" in summary:
            lines.append(f"{name.upper():<14}{summary[f'mean_{name}_ms']:>10.1f}"
                         + "".join(f"{summary[f'p{p:g}_{name}_ms']:>10.1f}" for p in percentiles))
    for err in summary["errors"]:
        lines.append(f"error: {err}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        percentiles = [float(p) for p in args.percentiles.split(",") if p]
    except ValueError:
        raise UsageError(f"--percentiles {args.percentiles!r}: expected numbers like 50,90,99") from None
    if not all(0 <= p <= 100 for p in percentiles) or not args.request_rate > 0:
        raise UsageError("--percentiles must lie in [0, 100] and --request-rate must be > 0")
    slos = parse_slos(args.goodput)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    results, duration, model = asyncio.run(run_load(args))
    summary = summarize(results, duration, slos, percentiles)
    print(f"model {model} at {args.base_url}, {args.endpoint}, {args.num_prompts} requests, "
          f"rate {args.request_rate}, max concurrency {args.max_concurrency or 'unbounded'}")
    print(render(summary, percentiles))
    if args.json_out:
        shown = {k: v for k, v in vars(args).items() if k not in ("func", "api_key")}
        with open(args.json_out, "w") as f:
            json.dump({"args": shown, "results": summary, "requests": [asdict(r) for r in results]}, f,
                      indent=2, default=str)
    return 0 if summary["completed"] else 1
