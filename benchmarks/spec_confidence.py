"""Time of one confidence-scheduling decision per decode step (deepinfer_spec.confidence).

Three variants per batch size, K drafts each, random confidences and a linear latency curve:
  choose  the engine path: ConfidenceScheduler.choose from host lists (padding, cumulative product,
          the exact greedy over totals, back to lists);
  padded  ConfidenceScheduler.choose_padded from a [R, K] host array (Proposal.confidences on the CPU);
  host    schedule_verification on numpy arrays (the decision alone);
  device  split_fixed_total on --device (the asynchronous-step split of a fixed total; on CUDA it is
          timed as launched work with events, no host sync inside).

    python benchmarks/spec_confidence.py --batches 1,64,256 --drafts 5 [--device cuda] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from deepinfer_spec.confidence import (
    ConfidenceScheduler,
    cumulative_confidence,
    schedule_verification,
    split_fixed_total,
)
from deepinfer_spec.latency import LatencyCurve, default_profile_sizes


def _median_us(run: Callable[[], object], repeats: int) -> float:
    for _ in range(10):
        run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def _device_us(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    if device.type != "cuda":
        return _median_us(run, repeats)
    for _ in range(10):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats


def measure(batch: int, drafts: int, device: torch.device, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(batch)
    confidences = torch.rand(batch, drafts, generator=gen) ** 0.3  # mostly high, as trained heads are
    max_tokens = batch * (drafts + 1)
    sizes = default_profile_sizes(max_tokens)
    curve = LatencyCurve(sizes, [20.0 + 0.02 * size for size in sizes])
    scheduler = ConfidenceScheduler(curve=curve)
    rows = confidences.tolist()
    padded, counts = confidences.numpy(), [drafts] * batch
    cum_conf = cumulative_confidence(confidences)
    host_conf = cum_conf.numpy()
    step_ms = curve.table(max_tokens)
    plan = schedule_verification(host_conf, step_ms)
    on_device = cum_conf.to(device)
    return {
        "batch": batch,
        "drafts": drafts,
        "chosen_total": plan.total_tokens,
        "choose_us": _median_us(lambda: scheduler.choose(rows), repeats),
        "padded_us": _median_us(lambda: scheduler.choose_padded(padded, counts), repeats),
        "host_us": _median_us(lambda: schedule_verification(host_conf, step_ms), repeats),
        "device": str(device),
        "device_us": _device_us(lambda: split_fixed_total(on_device, plan.total_tokens), repeats, device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--drafts", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    results = [measure(int(b), args.drafts, device, args.repeats) for b in args.batches.split(",")]
    header = ("batch", "K", "total", "choose us", "padded us", "host us", "device us", "device")
    print("{:>6} {:>3} {:>6} {:>10} {:>10} {:>9} {:>10}  {}".format(*header))
    for r in results:
        print(
            f"{r['batch']:>6} {r['drafts']:>3} {r['chosen_total']:>6} {r['choose_us']:>10.1f} "
            f"{r['padded_us']:>10.1f} {r['host_us']:>9.1f} {r['device_us']:>10.1f}  {r['device']}"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
