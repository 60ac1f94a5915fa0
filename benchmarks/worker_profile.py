"""Where the engine worker's wall time per decode step goes: `deepinfer bench` with cProfile (wall clock)
around `ModelRunner.execute` on the worker thread, one profile per batch size in --profile-batches.

Wall clock, not CPU time: a call that blocks the worker (an event or stream wait, a pinned-memory
allocation, the GIL held by the engine thread) shows as that call's own time. Only decode steps (one
token per sequence) of exactly a profiled batch size are recorded; the first --skip of each are left out
(graph capture, Triton compiles).

    python benchmarks/worker_profile.py --profile-batches 64,256 -- bench --model DIR --load-format dummy \\
        --device cuda --dtype bfloat16 --max-num-seqs 256 --num-requests 1 --input-len 16 --output-len 4 \\
        --overhead-batches 64,256 --overhead-steps 16 --cuda-graph-sizes 64 256
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from deepinfer.engine import model_runner
from deepinfer.entrypoints.cli.main import main as deepinfer_main


def install(batches: set[int], skip: int) -> dict[int, tuple[cProfile.Profile, list[float]]]:
    """Wrap ModelRunner.execute; returns {batch: (profile, wall seconds per recorded step)}."""
    profiles: dict[int, tuple[cProfile.Profile, list[float]]] = {}
    seen: dict[int, int] = {}
    execute = model_runner.ModelRunner.execute

    def profiled(self: model_runner.ModelRunner, sched: model_runner.SchedulerOutput
                 ) -> model_runner.StepResult:
        n = len(sched.segments)
        seen[n] = seen.get(n, 0) + 1
        if n not in batches or sched.num_tokens != n or seen[n] <= skip:
            return execute(self, sched)
        prof, walls = profiles.setdefault(n, (cProfile.Profile(time.perf_counter), []))
        t0 = time.perf_counter()
        prof.enable()  # this thread only: the worker
        try:
            return execute(self, sched)
        finally:
            prof.disable()
            walls.append(time.perf_counter() - t0)

    model_runner.ModelRunner.execute = profiled  # type: ignore[method-assign]
    return profiles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile-batches", default="64,256")
    parser.add_argument("--skip", type=int, default=3, help="decode steps of each batch size left out first")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("deepinfer_args", nargs=argparse.REMAINDER, help="after --: a deepinfer command")
    args = parser.parse_args()
    argv = args.deepinfer_args[1:] if args.deepinfer_args[:1] == ["--"] else args.deepinfer_args
    profiles = install({int(b) for b in args.profile_batches.split(",")}, args.skip)
    rc = deepinfer_main(argv)
    for n, (prof, walls) in sorted(profiles.items()):
        walls.sort()
        print(f"\n== worker at {n} sequences: {len(walls)} decode steps, wall median "
              f"{1e3 * walls[len(walls) // 2]:.3f} ms/step (cProfile on); own time per call below, "
              f"divide by {len(walls)} for ms per step")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)
    return rc


if __name__ == "__main__":
    sys.exit(main())
