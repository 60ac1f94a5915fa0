"""`deepinfer bench`'s overhead report (its JSON keys and what is not measured on the CPU) and `deepinfer
score --load-format dummy` (the weights bench runs, from config.json alone) on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from deepinfer import LLM
from deepinfer.engine.stats import StepStat
from deepinfer.entrypoints.cli import bench
from deepinfer.entrypoints.cli.bench import DEFINITIONS
from deepinfer.entrypoints.cli.main import main

PER_STEP = ("step_schedule_s", "step_postprocess_s", "step_cpu_overhead_s", "step_device_s", "step_gpu_s",
            "step_gpu_idle_s")


@pytest.fixture(scope="module")
def config_only(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("config-only")
    assert main(["make-checkpoint", "--config", "swa_only", "--config-only", "--out", str(out)]) == 0
    return str(out)


def bench_argv(model: str, out, *, requests: int, input_len: int, output_len: int, batches: str,
               steps: int) -> list[str]:
    """`deepinfer bench` on the CPU with dummy weights (4 sequences at most, 16 MiB cache), JSON to `out`."""
    return ["--log-level", "WARNING", "bench", "--model", model, "--load-format", "dummy", "--device", "cpu",
            "--num-requests", str(requests), "--input-len", str(input_len), "--output-len", str(output_len),
            "--overhead-batches", batches, "--overhead-steps", str(steps), "--max-num-seqs", "4",
            "--cache-mb", "16", "--json-out", str(out)]


def test_bench_overhead_report(config_only, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(bench_argv(config_only, out, requests=2, input_len=8, output_len=3, batches="1,3",
                           steps=3)) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and [o["running"] for o in result["overhead"]] == [1, 3]
    for o in result["overhead"]:
        assert o["measured_steps"] == len(o["per_step"]) == 3
        assert all(o[k] > 0 for k in ("step_schedule_s", "step_postprocess_s", "step_device_s", "step_s"))
        # no CUDA events on the CPU: the GPU columns and the hidden share are not measured, not 0
        assert o["step_gpu_s"] is None and o["step_gpu_idle_s"] is None and o["hidden_by_async"] is None
        assert [set(row) for row in o["per_step"]] == [set(StepStat.__slots__)] * 3
        assert all(row["num_seqs"] == row["num_tokens"] == o["running"] for row in o["per_step"])
    (t,) = result["throughput"]
    assert t["hidden_by_async"] is None and t["step_gpu_idle_s"] is None and t["decode_gpu_idle_s"] is None
    assert t["decode_step_s"] >= t["decode_worker_s"] > 0 and t["decode_steps"] >= 1
    reported = {*PER_STEP, "step_s", "hidden_by_async", "per_step"}
    assert reported <= set(result["definitions"]) == set(DEFINITIONS)
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.strip().startswith("running"))
    assert header.split() == ["running", "schedule", "ms", "post", "ms", "CPU", "ms", "worker", "ms", "GPU",
                              "span", "ms", "GPU", "idle", "ms", "step", "ms", "hidden"]
    rows = printed.splitlines()[printed.splitlines().index(header) + 1:][:2]
    assert [r.split()[0] for r in rows] == ["1", "3"] and all(r.split()[-1] == "-" for r in rows)


def test_steady_decode_steps():
    """Under async a step's period is the GPU time of the step two before it: a decode step counts once
    the two steps before it were decode steps of the same batch too."""
    shapes = [(4, 32), (4, 4), (4, 4), (4, 4), (4, 4), (3, 3), (4, 4), (4, 4), (4, 4), (4, 9), (4, 4)]
    steps = [StepStat(seqs, tokens, float(i), 0.0, 0.0, None) for i, (seqs, tokens) in enumerate(shapes)]
    assert [s.schedule_s for s in bench._steady(steps, 4)] == [3, 4, 8]
    assert bench._steady(steps[:3], 4) == []


def test_bench_interrupted_reports_what_it_measured(config_only, tmp_path, monkeypatch, capsys):
    overhead = bench._overhead

    def cut_at_three(llm, batch, args):  # Ctrl-C (`timeout -s INT`) during the second overhead batch
        if batch == 3:
            raise KeyboardInterrupt
        return overhead(llm, batch, args)

    monkeypatch.setattr(bench, "_overhead", cut_at_three)
    out = tmp_path / "bench.json"
    assert main(bench_argv(config_only, out, requests=1, input_len=4, output_len=2, batches="2,3",
                           steps=2)) == 130
    result = json.loads(out.read_text())
    assert not result["complete"] and len(result["throughput"]) == 1
    assert [o["running"] for o in result["overhead"]] == [2]
    assert "interrupted" in capsys.readouterr().err


def test_bench_help_explains_hidden_share(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Hidden by async = 1 - (GPU idle between steps) / (engine CPU time)" in text
    assert "clamped at 0" in text and "not measured" in text


def test_score_load_format_dummy(config_only, tmp_path, capsys):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"a": [0, 5, 17, 33, 2], "b": [9, 4]}))
    base = ["score", "--model", config_only, "--input", str(prompts), "--device", "cpu"]
    # a config-only directory has no weights to read: the error says to use dummy weights
    assert main([*base, "--out", str(tmp_path / "x.safetensors")]) == 1
    assert "--load-format dummy" in capsys.readouterr().err
    out = tmp_path / "dummy.safetensors"
    assert main([*base, "--load-format", "dummy", "--seed", "1", "--out", str(out)]) == 0
    got = load_file(str(out))
    assert [tuple(got[k].shape) for k in ("a", "b")] == [(5, got["a"].shape[1]), (2, got["a"].shape[1])]
    # the weights the engine draws from the same seed (bench --load-format dummy --seed 1)
    llm = LLM(config_only, load_format="dummy", seed=1, device="cpu", max_model_len=64, max_num_seqs=1,
              cache_bytes=16 << 20)
    try:
        want = llm.engine.model.score([[0, 5, 17, 33, 2]])[0].float()
    finally:
        llm.close()
    torch.testing.assert_close(got["a"], want)
