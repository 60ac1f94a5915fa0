"""`deepinfer bench`: offline throughput and latency on a synthetic workload, plus engine CPU overhead.

Two phases on one engine. Throughput: `--num-requests` random-token prompts with input/output lengths
drawn from a distribution, all at once (`--request-rate inf`) or as a Poisson stream; reports tokens/s,
TTFT/TPOT percentiles, prefill tokens/s and the time of a decode step at the full batch, per-step CPU
overhead and the share of it hidden by async scheduling. Several values of --num-requests /
--input-len / --output-len run one throughput workload each, in order (a single value applies to all),
e.g. `--num-requests 1 64 --input-len 2048 512 --output-len 128`. Overhead: for each batch size in
`--overhead-batches`, keeps exactly that many sequences decoding and reports per step (means): the
engine thread's CPU time planning it (schedule) and turning its samples into outputs (post, timed after
the samples reach the host), the worker's wall time queuing it (worker), the GPU's span from the step's
first to its last queued work (CUDA events, kernels and gaps), the GPU's idle time before the step
(from the previous step's end event to this one's start event) and the period (the worker's idle time
before the step + its own: the wall time per step), over steady decode steps (the first two after the
prefill carry its wait).

Hidden by async = 1 - (GPU idle between steps) / (engine CPU time), summed over the steps, clamped at
0: between two steps the GPU waits only for the engine thread and the hand-off to the worker, so 100%
means the engine's work never kept the GPU waiting; idle time beyond the CPU time (hand-off, GIL waits)
does not make it negative. Without CUDA events (CPU) or with --sync (every gap waits for the engine by
design) it is not measured: '-' here, null in the JSON. The worker's host time is not in it: compare
worker ms with GPU span ms (a worker slower than the GPU leaves idle time inside the spans).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from deepinfer.engine.stats import EngineStats, StepStat, hidden_share
from deepinfer.entrypoints.cli.engine_args import add_engine_args, llm_from_args
from deepinfer.entrypoints.cli.errors import UsageError, finite_float, positive_int, positive_rate
from deepinfer.sampling import SamplingParams

if TYPE_CHECKING:
    from deepinfer.engine import RequestOutput
    from deepinfer.entrypoints.llm import LLM


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark throughput, latency and engine overhead",
        description=__doc__,
    )
    w = parser.add_argument_group("workload")
    w.add_argument("--num-requests", type=positive_int, nargs="+", default=[64], metavar="N",
                   help="requests in the throughput phase (several: one workload each)")
    w.add_argument("--input-len", type=positive_int, nargs="+", default=[64], metavar="N",
                   help="mean prompt length in tokens (several: one per workload)")
    w.add_argument("--output-len", type=positive_int, nargs="+", default=[64], metavar="N",
                   help="mean output length in tokens (several: one per workload)")
    w.add_argument("--len-dist", choices=["fixed", "uniform"], default="uniform",
                   help="uniform: lengths drawn from [mean/2, 3*mean/2]")
    w.add_argument("--request-rate", type=positive_rate, default=float("inf"),
                   help="requests per second (Poisson arrivals); inf = all at once (offline batch)")
    w.add_argument("--temperature", type=finite_float, default=1.0, help="0 = greedy")
    w.add_argument("--workload-seed", type=int, default=0, help="seed of the prompt lengths and tokens")
    w.add_argument("--warmup", action="store_true",
                   help="run each workload once untimed before measuring it: JIT compilations (Triton "
                   "specialises kernels on first use) and allocator growth stay out of the numbers")
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


def _print_throughput(t: dict, cfg: dict) -> None:
    print(f"\nworkload: {t['requests']} requests, input ~{t['input_len']}, output ~{t['output_len']} "
          f"({cfg['len_dist']}), rate {cfg['request_rate']}/s, async {'off' if cfg['sync'] else 'on'}, "
          f"batch-invariant {'on' if cfg['batch_invariant'] else 'off'}")
    print(f"{'elapsed s':>10} {'out tok/s':>10} {'total tok/s':>11} {'TTFT p50/p90/p99 ms':>22} "
          f"{'TPOT p50/p90/p99 ms':>22}")
    print(f"{t['elapsed_s']:>10.2f} {t['output_tok_s']:>10.1f} {t['total_tok_s']:>11.1f} "
          f"{'/'.join(_ms(v) for v in t['ttft_s'].values()):>22} "
          f"{'/'.join(_ms(v) for v in t['tpot_s'].values()):>22}")
    if "prefill_steps" in t:
        prefill = t["prefill_tok_s"]
        print(f"prefill {'-' if prefill is None else f'{prefill:.0f}'} tok/s over {t['prefill_steps']} "
              f"step(s); decode at batch {t['decode_batch']}: {_ms(t['decode_step_s'])} ms/step "
              f"(busy {_ms(t['decode_busy_s'])}, worker {_ms(t['decode_worker_s'])}, GPU idle before "
              f"{_ms(t['decode_gpu_idle_s'])}) over {t['decode_steps']} steps")
    hidden = t.get("hidden_by_async")
    print(f"steps {t.get('steps')}, worker {_ms(t.get('step_device_s'))} ms/step (GPU span "
          f"{_ms(t.get('step_gpu_s'))}, GPU idle {_ms(t.get('step_gpu_idle_s'))}), CPU overhead "
          f"{_ms(t.get('step_cpu_overhead_s'))} ms/step, hidden by async "
          f"{'-' if hidden is None else f'{100 * hidden:.0f}%'}, preemptions {t['preemptions']}", flush=True)


def workloads(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(requests, input length, output length) per throughput workload; one value applies to all."""
    lists = {"--num-requests": args.num_requests, "--input-len": args.input_len,
             "--output-len": args.output_len}
    n = max(len(v) for v in lists.values())
    for flag, values in lists.items():
        if len(values) not in (1, n):
            raise UsageError(f"{flag}: {len(values)} values for {n} workloads (give 1 or {n})")
    return list(zip(*(v * n if len(v) == 1 else v for v in lists.values()), strict=True))


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.workload_seed)
    lengths = [((i, o), _lengths(rng, i, n, args.len_dist), _lengths(rng, o, n, args.len_dist))
               for n, i, o in workloads(args)]
    if args.max_model_len is None:
        args.max_model_len = max(i + o for _, ins, outs in lengths for i, o in zip(ins, outs)) + 8
    llm = llm_from_args(args)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    result: dict = {"config": config, "definitions": DEFINITIONS, "complete": False, "throughput": [],
                    "overhead": []}
    try:  # each workload printed as measured
        for mean, ins, outs in lengths:
            result["throughput"].append(_throughput(llm, rng, mean, ins, outs, args))
            _print_throughput(result["throughput"][-1], config)
        for b in args.overhead_batches:
            if b <= args.max_num_seqs:
                result["overhead"].append(_overhead(llm, b, args))
        result["complete"] = True
    finally:  # an interrupted run (e.g. `timeout -s INT`) still reports what it measured
        llm.close()
        _print_overhead(result["overhead"])
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2, default=str) + "\n")
            print(f"wrote {args.json_out}")
    return 0


def _prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _throughput(llm: LLM, rng: random.Random, mean: tuple[int, int], ins: list[int], outs: list[int],
                args: argparse.Namespace) -> dict:
    """One workload: prompts of lengths `ins` (mean `mean[0]`) generating `outs` tokens each."""
    engine = llm.engine
    reqs = [(_prompt(rng, engine.vocab_size, i), SamplingParams(
        max_tokens=o, ignore_eos=True, temperature=args.temperature, seed=k)) for k, (i, o) in enumerate(
        zip(ins, outs))]
    gaps = [rng.expovariate(args.request_rate) if args.request_rate != float("inf") else 0.0 for _ in reqs]
    if args.warmup:
        _drive(llm, reqs, [0.0] * len(reqs))
    engine.stats = EngineStats()
    done, elapsed = _drive(llm, reqs, gaps)
    ttft = [o.metrics.ttft for o in done if o.metrics.ttft is not None]
    tpot = [o.metrics.tpot for o in done if o.metrics.tpot is not None]
    generated = sum(len(c.token_ids) for o in done for c in o.outputs)
    steps = list(engine.stats.steps)
    return {
        "requests": len(done), "input_len": mean[0], "output_len": mean[1],
        "elapsed_s": elapsed, "prompt_tokens": sum(ins), "output_tokens": generated,
        "output_tok_s": generated / elapsed, "total_tok_s": (generated + sum(ins)) / elapsed,
        "ttft_s": {f"p{q}": _pct(ttft, q) for q in (50, 90, 99)},
        "tpot_s": {f"p{q}": _pct(tpot, q) for q in (50, 90, 99)},
        **_step_summary(steps),
        **(_phases(steps) if args.speculator == "none" else {}),
        "hidden_by_async": hidden_share(steps),
        "preemptions": engine.stats.num_preemptions,
    }


def _drive(llm: LLM, reqs: list[tuple[list[int], SamplingParams]],
           gaps: list[float]) -> tuple[list[RequestOutput], float]:
    """Submit `reqs` (request k `gaps[k]` seconds after k-1) and step until all finish."""
    engine = llm.engine
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
    return done, time.perf_counter() - start


def _step_summary(steps: list[StepStat]) -> dict:
    if not steps:
        return {}
    gpu = [s.gpu_s for s in steps if s.gpu_s is not None]
    gaps = [s.gpu_idle_s for s in steps if s.gpu_idle_s is not None]
    return {
        "steps": len(steps),
        "step_device_s": statistics.mean(s.device_s for s in steps),
        # CUDA only: the GPU's own time per step (device_s is the worker's wall time, host work included)
        "step_gpu_s": statistics.mean(gpu) if gpu else None,
        "step_gpu_idle_s": statistics.mean(gaps) if gaps else None,
        "step_schedule_s": statistics.mean(s.schedule_s for s in steps),
        "step_postprocess_s": statistics.mean(s.process_s for s in steps),
        "step_cpu_overhead_s": statistics.mean(s.schedule_s + s.process_s for s in steps),
    }


def _phases(steps: list[StepStat]) -> dict:
    """Prefill speed and the decode step at the full batch (without speculation, where a step holding
    more tokens than sequences holds prompt tokens). Busy times are the GPU's on CUDA (async launches
    return early), the worker's elsewhere; under async a decode step's period also counts the worker's
    wait before it (the wall time per step; sync mode: see TPOT)."""
    def busy(s: StepStat) -> float:
        return s.gpu_s if s.gpu_s is not None else s.device_s

    prefill = [s for s in steps if s.num_tokens > s.num_seqs]
    decode = [s for s in steps if s.num_tokens == s.num_seqs]
    batch = max((s.num_seqs for s in decode), default=0)
    steady = _steady(steps, batch) or [s for s in steps if s.num_tokens == s.num_seqs == batch]
    prefill_s = sum(busy(s) for s in prefill)
    gaps = [s.gpu_idle_s for s in steady if s.gpu_idle_s is not None]
    return {
        "prefill_steps": len(prefill),
        "prefill_tok_s": sum(s.num_tokens for s in prefill) / prefill_s if prefill_s else None,
        "decode_batch": batch, "decode_steps": len(steady),
        "decode_step_s": _period(steady),
        "decode_busy_s": statistics.mean(busy(s) for s in steady) if steady else None,
        "decode_worker_s": statistics.mean(s.device_s for s in steady) if steady else None,
        "decode_gpu_idle_s": statistics.mean(gaps) if gaps else None,
    }


def _steady(steps: list[StepStat], batch: int) -> list[StepStat]:
    """The decode steps of `batch` sequences whose two steps before were such steps too. Under async a
    step is handed to the worker once the samples of the step two before it are on the host, so its
    period (the worker's idle before it + its own time) is that step's GPU time when the GPU is the
    bottleneck: a prefill two steps before would count in it, and a step right after a prefill was queued
    while the worker still queued the prefill (its period: its own host time alone)."""
    full = [s.num_tokens == s.num_seqs == batch for s in steps]
    return [s for i, s in enumerate(steps) if i >= 2 and full[i] and full[i - 1] and full[i - 2]]


def _period(steps: list[StepStat]) -> float | None:
    """Mean worker end-to-end time of `steps` (async only: sync steps record no worker idle)."""
    periods = [s.idle_s + s.device_s for s in steps if s.idle_s is not None]
    return statistics.mean(periods) if periods else None


def _overhead(llm: LLM, batch: int, args: argparse.Namespace) -> dict:
    """Keep `batch` sequences decoding and time the engine's CPU work per decode step (--warmup: the same
    round once untimed first, so first-use compilations at this batch size stay out)."""
    if args.warmup:
        _decode_round(llm, batch, args)
    steps = _decode_round(llm, batch, args)
    return {"running": batch, "measured_steps": len(steps), **_step_summary(steps), "step_s": _period(steps),
            "hidden_by_async": hidden_share(steps), "per_step": [asdict(s) for s in steps]}


def _decode_round(llm: LLM, batch: int, args: argparse.Namespace) -> list[StepStat]:
    """`batch` short prompts prefilled, then --overhead-steps steady decode steps of all of them."""
    engine = llm.engine
    rng = random.Random(batch)
    params = SamplingParams(max_tokens=args.overhead_steps + 6, ignore_eos=True,
                            temperature=args.temperature, seed=1)
    for _ in range(batch):
        engine.add_request(_prompt(rng, engine.vocab_size, 8), params)
    while any(s.num_computed < len(s.token_ids) - 1 for s in engine.scheduler.running) or \
            engine.scheduler.waiting:
        engine.step()  # prefills
    engine.stats = EngineStats()
    while engine.has_unfinished_requests():
        engine.step()
    # under async the last prefill step is still in flight when the stats are reset
    return _steady(list(engine.stats.steps), batch)[: args.overhead_steps]


# what the JSON's per-step figures mean (means over the steps named; null: not measured)
DEFINITIONS = {
    "step_schedule_s": "engine thread CPU time planning a step",
    "step_postprocess_s": "engine thread CPU time turning a step's samples into outputs, from when they "
                          "reach the host (the wait for them is device time)",
    "step_cpu_overhead_s": "schedule + post-process",
    "step_device_s": "worker thread wall time queuing a step (resets, forward, sampling; on CUDA mostly host "
                     "time, kernels run asynchronously)",
    "step_gpu_s": "CUDA: GPU span of a step, its start event to its end event (kernels and gaps in between)",
    "step_gpu_idle_s": "CUDA, async: GPU idle before a step, the previous step's end event to its start "
                       "event",
    "step_s": "async: the worker's idle time before a step + its own (the wall time per step)",
    "decode_step_s": "throughput: step_s of the steady decode steps at the full batch (decode_busy_s: "
                     "their GPU span, the worker's time off CUDA; decode_worker_s, decode_gpu_idle_s: "
                     "step_device_s, step_gpu_idle_s of those steps)",
    "hidden_by_async": "1 - sum(GPU idle before steps) / sum(engine CPU per step), clamped at 0: the share "
                       "of the engine's CPU work the GPU did not wait for; null without CUDA events or with "
                       "--sync",
    "per_step": "overhead phase: every measured step (engine.stats.StepStat fields, seconds)",
    "complete": "false: the run was interrupted (or failed) and holds the workloads measured before",
}


def _print_overhead(overhead: list[dict]) -> None:
    if overhead:
        print(f"\n{'running':>8} {'schedule ms':>12} {'post ms':>8} {'CPU ms':>7} {'worker ms':>10} "
              f"{'GPU span ms':>12} {'GPU idle ms':>12} {'step ms':>8} {'hidden':>7}")
        for o in overhead:
            h = o.get("hidden_by_async")
            print(f"{o['running']:>8} {_ms(o.get('step_schedule_s')):>12} "
                  f"{_ms(o.get('step_postprocess_s')):>8} {_ms(o.get('step_cpu_overhead_s')):>7} "
                  f"{_ms(o.get('step_device_s')):>10} {_ms(o.get('step_gpu_s')):>12} "
                  f"{_ms(o.get('step_gpu_idle_s')):>12} {_ms(o.get('step_s')):>8} "
                  f"{'-' if h is None else f'{100 * h:.0f}%':>7}")
