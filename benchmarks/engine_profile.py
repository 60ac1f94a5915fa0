"""Where a decode step's device time goes through the engine: torch.profiler around a few steady decode
steps of `deepinfer bench` (e.g. benchmarks/engine_slice.sh's workload (a)), started and stopped on the
worker thread.

Per step (mean over the analysed steps): the graph replay as one line (kernels, kernel time, busy time,
its span: the gaps between its kernels), then every device activity launched outside the replay by
part of the step (input ids, metadata, sampler, ...) and op (innermost aten op, else the kernel), with
the GPU idle time before it and how much of that idle time the GPU spent waiting for the host to launch
it (the launch call ended after the GPU had finished everything before). On the CPU: the top-level aten
ops of each part with their host time (what runs per step, without a GPU).

    python benchmarks/engine_profile.py [--batch 1 --skip 40 --steps 8 --settle 2 --trace t.json] \\
        -- bench --model DIR --load-format dummy --device cuda --dtype bfloat16 --cache-precision release \\
        --max-num-seqs 256 --cache-mb 1024 --len-dist fixed --num-requests 1 --input-len 2048 \\
        --output-len 128 --overhead-batches "" --cuda-graph-sizes 1
The first --skip decode steps at exactly --batch sequences run unprofiled, the next --steps are profiled
and the first --settle of those (the profiler's start perturbs them) are left out of the tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from profile_step import PREFIX, annotate, busy_us
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from deepinfer.engine import model_runner
from deepinfer.entrypoints.cli.main import main as deepinfer_main
from deepinfer.models.deepseek_v41 import graphs, metadata, runtime
from deepinfer.sampling import sampler
from deepinfer.structured import manager

STEP = PREFIX + "step "
GRAPH = "graph replay"
# the parts of a step, each inside its own range: (owner, attribute, label)
PARTS = [
    (model_runner.ModelRunner, "_input_ids", "input ids"),
    (model_runner.ModelRunner, "_event", "timing events"),
    (runtime.DeepseekV41Runtime, "forward", "forward"),
    (graphs.DecodeGraphs, "forward", "graph step"),
    (metadata.MetadataBuilder, "build", "metadata"),
    (manager.StructuredManager, "apply", "structured"),
    (sampler.Sampler, "__call__", "sampler"),
    (sampler.SamplingGraphs, "sample", "sampling graph"),
    (sampler, "sampling_metadata", "sampling metadata"),
    (sampler.HostCopy, "__init__", "host copies"),
]


@dataclass
class Activity:
    """One device activity (kernel, copy, set) or, on the CPU, one top-level aten op."""

    name: str
    start: float  # us, the profiler's time base
    end: float
    label: str  # part / op
    graph: bool  # ran inside a graph replay
    launched: float  # when its launch call ended (host)


@dataclass
class Step:
    index: int
    start: float  # the step's host range on the worker thread
    end: float
    host: dict[str, float] = field(default_factory=dict)  # part -> host us
    acts: list[Activity] = field(default_factory=list)


def _stack_label(ranges: list[tuple[float, float, str]], t: float) -> str:
    inner = [label for s, e, label in ranges if s <= t <= e]
    return inner[-1] if inner else "runner"


def collect(prof: profile, cuda: bool) -> list[Step]:
    events = list(prof.events())
    marks = sorted((e.time_range.start, e.time_range.end, e.name[len(PREFIX):], e.thread) for e in events
                   if e.name.startswith(PREFIX) and e.device_type == DeviceType.CPU)
    steps = [Step(int(name[len(STEP) - len(PREFIX):]), s, e) for s, e, name, _ in marks
             if name.startswith(STEP[len(PREFIX):])]
    thread = next((t for _, _, name, t in marks if name.startswith(STEP[len(PREFIX):])), None)
    parts = [(s, e, name) for s, e, name, t in marks if t == thread and not name.startswith("step ")]
    # innermost part first: ranges sorted by start, the last containing one is the innermost
    aten = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                  if e.device_type == DeviceType.CPU and e.thread == thread and e.name.startswith("aten::"))

    def step_of(t: float) -> Step | None:
        return next((st for st in steps if st.start <= t <= st.end), None)

    for s, e, name in parts:
        if (st := step_of(s)) is not None:
            st.host[name] = st.host.get(name, 0.0) + e - s
    if not cuda:  # top-level aten ops of the worker thread
        tops, end = [], float("-inf")
        for s, e, name in aten:
            if s >= end:
                tops.append((s, e, name))
                end = e
        for s, e, name in tops:
            if (st := step_of(s)) is not None:
                st.acts.append(Activity(name, s, e, f"{_stack_label(parts, s)} / {name}", False, e))
        return steps
    launches = {e.id: e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("cu")}
    for e in events:
        if e.device_type != DeviceType.CUDA or e.name.startswith(PREFIX):
            continue
        launch = launches.get(e.id)
        if launch is None or (st := step_of(launch.time_range.start)) is None:
            continue
        t = launch.time_range.start
        part = _stack_label(parts, t)
        replay = "GraphLaunch" in launch.name
        in_graph = replay and part == "graph step"  # the forward's graph; the sampler's is outside it
        op = GRAPH if replay else _stack_label(aten, t)
        op = e.name if op == "runner" else op
        label = GRAPH if in_graph else f"{part} / {op}"
        st.acts.append(Activity(e.name, e.time_range.start, e.time_range.end, label, in_graph,
                                launch.time_range.end))
    return steps


def report(steps: list[Step], settle: int, cuda: bool, batch: int) -> str:
    steps = [s for s in steps if s.acts][settle:]
    if not steps:
        return "no profiled steps with device work (fewer decode steps than --skip + --steps?)"
    n = len(steps)
    lines = [f"\n== decode steps at batch {batch}: {n} analysed (steps {steps[0].index}-{steps[-1].index}), "
             "per step means"]
    host = defaultdict(float)
    for s in steps:
        for k, v in s.host.items():
            host[k] += v / n
    wall = sum(s.end - s.start for s in steps) / n
    lines.append(f"worker host time {wall:.0f} us; parts (nested ranges overlap): "
                 + ", ".join(f"{k} {v:.0f}" for k, v in sorted(host.items(), key=lambda kv: -kv[1])))
    if not cuda:
        rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for s in steps:
            for a in s.acts:
                rows[a.label][0] += 1 / n
                rows[a.label][1] += (a.end - a.start) / n
        lines += ["", "| part / top-level aten op | calls | host us |", "|---|---:|---:|"]
        lines += [f"| {k} | {c:.1f} | {us:.1f} |"
                  for k, (c, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])]
        return "\n".join(lines)
    # the device timeline of every analysed step, in start order, for the gaps before each activity
    timeline = sorted((a for s in steps for a in s.acts), key=lambda a: a.start)
    gap_before: dict[int, tuple[float, float]] = {}  # id(activity) -> (idle us, idle waiting for the host)
    prev_end = None
    for a in timeline:
        if prev_end is not None:
            idle = max(0.0, a.start - prev_end)
            waiting = max(0.0, min(a.start, a.launched) - prev_end) if a.launched > prev_end else 0.0
            gap_before[id(a)] = (idle, min(idle, waiting))
        prev_end = a.end if prev_end is None else max(prev_end, a.end)
    period = (timeline[-1].end - timeline[0].start) / n
    graph_acts = [a for a in timeline if a.graph]
    replays = [[a for a in s.acts if a.graph] for s in steps]
    g_kernel = sum(a.end - a.start for a in graph_acts) / n
    g_span = sum(max(a.end for a in r) - min(a.start for a in r) for r in replays if r) / n
    g_busy = sum(busy_us(r) for r in replays) / n
    g_gaps = sum(gap_before.get(id(a), (0.0, 0.0))[0] for r in replays for a in r[1:]) / n
    out = [a for a in timeline if not a.graph]
    lines.append(f"GPU: {period:.0f} us per step from the first analysed activity to the last, busy "
                 f"{busy_us(timeline) / n:.0f} us")
    lines.append(f"{GRAPH}: {len(graph_acts) / n:.0f} kernels, kernel time {g_kernel:.0f} us, busy "
                 f"{g_busy:.0f} us, span {g_span:.0f} us (idle between its kernels {g_gaps:.0f} us)")
    o_kernel = sum(a.end - a.start for a in out) / n
    o_idle = sum(gap_before.get(id(a), (0.0, 0.0))[0] for a in out) / n
    o_wait = sum(gap_before.get(id(a), (0.0, 0.0))[1] for a in out) / n
    first_idle = sum(gap_before.get(id(r[0]), (0.0, 0.0))[0] for r in replays if r) / n
    first_wait = sum(gap_before.get(id(r[0]), (0.0, 0.0))[1] for r in replays if r) / n
    lines.append(f"outside the replay: {len(out) / n:.1f} activities, device time {o_kernel:.0f} us, GPU "
                 f"idle before them {o_idle:.0f} us ({o_wait:.0f} us waiting for the host); idle before the "
                 f"replay's first kernel {first_idle:.0f} us ({first_wait:.0f} us waiting for the host)")
    rows2: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    names: dict[str, set[str]] = defaultdict(set)
    for a in out:
        idle, wait = gap_before.get(id(a), (0.0, 0.0))
        r = rows2[a.label]
        r[0] += 1 / n
        r[1] += (a.end - a.start) / n
        r[2] += idle / n
        r[3] += wait / n
        names[a.label].add(a.name[:48])
    lines += ["", "| part / op | launches | device us | idle before us | waiting for host us | activities |",
              "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {k} | {c:.1f} | {us:.1f} | {idle:.1f} | {wait:.1f} | {'; '.join(sorted(names[k]))} |"
              for k, (c, us, idle, wait) in sorted(rows2.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))]
    return "\n".join(lines)


class Profiler:
    """Starts torch.profiler at the (skip + 1)-th decode step of `batch` sequences on the worker thread,
    stops it (after synchronising) at the (skip + steps)-th and keeps the report."""

    def __init__(self, batch: int, skip: int, steps: int, settle: int, trace: str | None) -> None:
        self.batch, self.skip, self.steps, self.settle, self.trace = batch, skip, steps, settle, trace
        self.seen = 0
        self.prof: profile | None = None
        self.report: str | None = None
        # the last skip // 2 unprofiled steps: the worker's wall time in execute, and in graph replay calls
        self.host_s: list[float] = []
        self.replay_s: list[float] = []
        self._replay = 0.0

    def install(self) -> None:
        for owner, name, label in PARTS:
            setattr(owner, name, annotate(getattr(owner, name), label))
        execute = model_runner.ModelRunner.execute
        replay = torch.cuda.CUDAGraph.replay

        def timed_replay(graph: torch.cuda.CUDAGraph) -> None:
            t0 = time.perf_counter()
            replay(graph)
            self._replay += time.perf_counter() - t0

        torch.cuda.CUDAGraph.replay = timed_replay  # type: ignore[method-assign]

        def profiled(runner: model_runner.ModelRunner, sched: model_runner.SchedulerOutput
                     ) -> model_runner.StepResult:
            n = len(sched.segments)
            if n != self.batch or sched.num_tokens != n or self.report is not None:
                return execute(runner, sched)
            self.seen += 1
            k = self.seen - self.skip
            if k < 1:
                self._replay, t0 = 0.0, time.perf_counter()
                result = execute(runner, sched)
                if k > -(self.skip // 2):
                    self.host_s.append(time.perf_counter() - t0)
                    self.replay_s.append(self._replay)
                return result
            cuda = runner._device.type == "cuda"
            if k == 1:
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                self.prof = profile(activities=acts)
                self.prof.start()
            with record_function(f"{STEP}{k}"):
                result = execute(runner, sched)
            if k == self.steps:
                if cuda:
                    torch.cuda.synchronize(runner._device)
                self.prof.stop()  # type: ignore[union-attr]
                if self.trace:
                    self.prof.export_chrome_trace(self.trace)  # type: ignore[union-attr]
                self.report = self.unprofiled() + report(collect(self.prof, cuda), self.settle, cuda,
                                                         self.batch)
                print(self.report, flush=True)  # now: a run cut short later keeps it
            return result

        model_runner.ModelRunner.execute = profiled  # type: ignore[method-assign]

    def unprofiled(self) -> str:
        """The worker's wall time per decode step without the profiler (its ranges still on)."""
        if not self.host_s:
            return ""
        host, replay = sorted(self.host_s), sorted(self.replay_s)
        return (f"\n== {len(host)} unprofiled decode steps before: worker execute median "
                f"{1e6 * host[len(host) // 2]:.0f} us (mean {1e6 * sum(host) / len(host):.0f}), of it in "
                f"CUDA graph replay calls (forward and sampler) median "
                f"{1e6 * replay[len(replay) // 2]:.0f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1, help="profile decode steps of this many sequences")
    parser.add_argument("--skip", type=int, default=40, help="such decode steps left unprofiled first")
    parser.add_argument("--steps", type=int, default=8, help="decode steps profiled")
    parser.add_argument("--settle", type=int, default=2, help="profiled steps left out of the tables")
    parser.add_argument("--trace", default=None, help="write the profile as a Chrome trace here")
    parser.add_argument("deepinfer_args", nargs=argparse.REMAINDER, help="after --: a deepinfer command")
    args = parser.parse_args()
    if args.steps <= args.settle:
        parser.error("--steps must exceed --settle")
    argv = args.deepinfer_args[1:] if args.deepinfer_args[:1] == ["--"] else args.deepinfer_args
    prof = Profiler(args.batch, args.skip, args.steps, args.settle, args.trace)
    prof.install()
    if torch.cuda.is_available():  # the profiler's one-time set-up (CUPTI) on this thread, before the run
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda")
    rc = deepinfer_main(argv)
    if prof.report is None:
        print(f"profiled nothing: {prof.seen} decode steps at batch {args.batch} (--skip {args.skip} + "
              f"--steps {args.steps} needed)", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
