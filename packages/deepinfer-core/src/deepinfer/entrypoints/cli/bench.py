"""`deepinfer bench`: offline throughput and latency on a synthetic workload, plus engine CPU overhead.

Two phases on one engine. Throughput: `--num-requests` random-token prompts with input/output lengths
drawn from a distribution, all at once (`--request-rate inf`) or as a Poisson stream; reports tokens/s,
TTFT/TPOT percentiles, per-step CPU overhead and the share of it hidden by async scheduling. Overhead:
for each batch size in `--overhead-batches`, keeps exactly that many sequences decoding and reports the
scheduler + post-processing time per step (the engine's CPU cost, independent of the model's speed).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from deepinfer.engine.stats import EngineStats, StepStat
from deepinfer.entrypoints.cli.engine_args import add_engine_args, llm_from_args
from deepinfer.entrypoints.cli.errors import finite_float, positive_int, positive_rate
from deepinfer.sampling import SamplingParams

if TYPE_CHECKING:
    from deepinfer.entrypoints.llm import LLM


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark throughput, latency and engine overhead",
        description=__doc__,
    )
    w = parser.add_argument_group("workload")
    w.add_argument("--num-requests", type=positive_int, default=64, help="requests in the throughput phase")
    w.add_argument("--input-len", type=positive_int, default=64, help="mean prompt length (tokens)")
    w.add_argument("--output-len", type=positive_int, default=64, help="mean output length (tokens)")
    w.add_argument("--len-dist", choices=["fixed", "uniform"], default="uniform",
                   help="uniform: lengths drawn from [mean/2, 3*mean/2]")
    w.add_argument("--request-rate", type=positive_rate, default=float("inf"),
                   help="requests per second (Poisson arrivals); inf = all at once (offline batch)")
    w.add_argument("--temperature", type=finite_float, default=1.0, help="0 = greedy")
    w.add_argument("--workload-seed", type=int, default=0, help="seed of the prompt lengths and tokens")
    w.add_argument("--overhead-batches", type=batch_sizes, default="1,64,256",
                   help="comma-separated running-sequence counts for the overhead phase ('' to skip)")
    w.add_argument("--overhead-steps", type=positive_int, default=16,
                   help="decode steps measured per batch size")
    parser.add_argument("--json-out", default=None, help="write the results here as JSON")
    add_engine_args(parser)
    parser.set_defaults(func=run)


def batch_sizes(text: str) -> list[int]:
    return [positive_int(b) for b in text.split(",") if b.strip()]


def _lengths(rng: random.Random, mean: int, n: int, dist: str) -> list[int]:
    if dist == "fixed":
        return [mean] * n
    return [rng.randint(max(1, mean // 2), max(1, mean * 3 // 2)) for _ in range(n)]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.2f}"


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.workload_seed)
    ins = _lengths(rng, args.input_len, args.num_requests, args.len_dist)
    outs = _lengths(rng, args.output_len, args.num_requests, args.len_dist)
    if args.max_model_len is None:
        args.max_model_len = max(i + o for i, o in zip(ins, outs)) + 8
    llm = llm_from_args(args)
    try:
        result = {"config": {k: v for k, v in vars(args).items() if k != "func"},
                  "throughput": _throughput(llm, rng, ins, outs, args),
                  "overhead": [_overhead(llm, b, args) for b in args.overhead_batches
                               if b <= args.max_num_seqs]}
    finally:
        llm.close()
    _print(result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.json_out}")
    return 0


def _prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _throughput(llm: LLM, rng: random.Random, ins: list[int], outs: list[int],
                args: argparse.Namespace) -> dict:
    engine = llm.engine
    engine.stats = EngineStats()
    reqs = [(_prompt(rng, engine.vocab_size, i), SamplingParams(
        max_tokens=o, ignore_eos=True, temperature=args.temperature, seed=k)) for k, (i, o) in enumerate(
        zip(ins, outs))]
    gaps = [rng.expovariate(args.request_rate) if args.request_rate != float("inf") else 0.0 for _ in reqs]
    done = []
    start = time.perf_counter()
    due, k = start, 0
    while k < len(reqs) or engine.has_unfinished_requests():
        now = time.perf_counter()
        while k < len(reqs) and due <= now:
            engine.add_request(*reqs[k])
            k += 1
            due += gaps[k] if k < len(reqs) else 0.0
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, due - now))
            continue
        done += [o for o in engine.step() if o.finished]
    elapsed = time.perf_counter() - start
    ttft = [o.metrics.ttft for o in done if o.metrics.ttft is not None]
    tpot = [o.metrics.tpot for o in done if o.metrics.tpot is not None]
    generated = sum(len(c.token_ids) for o in done for c in o.outputs)
    steps = list(engine.stats.steps)
    return {
        "requests": len(done), "elapsed_s": elapsed, "prompt_tokens": sum(ins), "output_tokens": generated,
        "output_tok_s": generated / elapsed, "total_tok_s": (generated + sum(ins)) / elapsed,
        "ttft_s": {f"p{q}": _pct(ttft, q) for q in (50, 90, 99)},
        "tpot_s": {f"p{q}": _pct(tpot, q) for q in (50, 90, 99)},
        **_step_summary(steps),
        "hidden_by_async": engine.stats.hidden_fraction(),
        "preemptions": engine.stats.num_preemptions,
    }


def _step_summary(steps: list[StepStat]) -> dict:
    if not steps:
        return {}
    gpu = [s.gpu_s for s in steps if s.gpu_s is not None]
    return {
        "steps": len(steps),
        "step_device_s": statistics.mean(s.device_s for s in steps),
        # CUDA only: the GPU's own time per step (device_s is the worker's wall time, host work included)
        "step_gpu_s": statistics.mean(gpu) if gpu else None,
        "step_schedule_s": statistics.mean(s.schedule_s for s in steps),
        "step_postprocess_s": statistics.mean(s.process_s for s in steps),
        "step_cpu_overhead_s": statistics.mean(s.schedule_s + s.process_s for s in steps),
    }


def _overhead(llm: LLM, batch: int, args: argparse.Namespace) -> dict:
    """Keep `batch` sequences decoding and time the engine's CPU work per decode step."""
    engine = llm.engine
    rng = random.Random(batch)
    params = SamplingParams(max_tokens=args.overhead_steps + 4, ignore_eos=True,
                            temperature=args.temperature, seed=1)
    for _ in range(batch):
        engine.add_request(_prompt(rng, engine.vocab_size, 8), params)
    while any(s.num_computed < len(s.token_ids) - 1 for s in engine.scheduler.running) or \
            engine.scheduler.waiting:
        engine.step()  # prefills
    engine.stats = EngineStats()
    while engine.has_unfinished_requests():
        engine.step()
    steps = [s for s in engine.stats.steps if s.num_seqs == batch][: args.overhead_steps]
    return {"running": batch, "measured_steps": len(steps), **_step_summary(steps),
            "hidden_by_async": engine.stats.hidden_fraction()}


def _print(result: dict) -> None:
    t = result["throughput"]
    cfg = result["config"]
    print(f"\nworkload: {t['requests']} requests, input ~{cfg['input_len']}, output ~{cfg['output_len']} "
          f"({cfg['len_dist']}), rate {cfg['request_rate']}/s, async {'off' if cfg['sync'] else 'on'}, "
          f"batch-invariant {'on' if cfg['batch_invariant'] else 'off'}")
    print(f"{'elapsed s':>10} {'out tok/s':>10} {'total tok/s':>11} {'TTFT p50/p90/p99 ms':>22} "
          f"{'TPOT p50/p90/p99 ms':>22}")
    print(f"{t['elapsed_s']:>10.2f} {t['output_tok_s']:>10.1f} {t['total_tok_s']:>11.1f} "
          f"{'/'.join(_ms(v) for v in t['ttft_s'].values()):>22} "
          f"{'/'.join(_ms(v) for v in t['tpot_s'].values()):>22}")
    hidden = t.get("hidden_by_async")
    print(f"steps {t.get('steps')}, device {_ms(t.get('step_device_s'))} ms/step (GPU "
          f"{_ms(t.get('step_gpu_s'))}), CPU overhead "
          f"{_ms(t.get('step_cpu_overhead_s'))} ms/step, hidden by async "
          f"{'-' if hidden is None else f'{100 * hidden:.0f}%'}, preemptions {t['preemptions']}")
    if result["overhead"]:
        print(f"\n{'running':>8} {'schedule ms':>12} {'post ms':>8} {'CPU ms/step':>12} {'device ms':>10} "
              f"{'GPU ms':>7} {'hidden':>7}")
        for o in result["overhead"]:
            h = o.get("hidden_by_async")
            print(f"{o['running']:>8} {_ms(o.get('step_schedule_s')):>12} "
                  f"{_ms(o.get('step_postprocess_s')):>8} {_ms(o.get('step_cpu_overhead_s')):>12} "
                  f"{_ms(o.get('step_device_s')):>10} {_ms(o.get('step_gpu_s')):>7} "
                  f"{'-' if h is None else f'{100 * h:.0f}%':>7}")
