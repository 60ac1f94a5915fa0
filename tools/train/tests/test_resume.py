"""Training stopped and resumed through the CLI (`--stop-after-steps`, `--state`, `--resume`) ends bitwise
where one uninterrupted run ends, in both stages (target, then the DSpark drafter), on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from deepinfer.testing import tiny_config
from deepinfer.tokenizer import build_synthetic_tokenizer
from tools.train import train
from tools.train.corpus import is_eval_file
from tools.train.evaluate import acceptance

_CODE = 'def f{i}(x: int) -> int:\n    """Add {i}."""\n    return x + {i}\n\n\nprint(f{i}(2))\n'
TIMING = ("tok_per_s", "elapsed_s", "_seconds")


def _corpus(root: Path) -> Path:
    names = [f"mod{i}.py" for i in range(400)]
    held_out = next(n for n in names if is_eval_file(n))
    root.mkdir()
    for k, name in enumerate([*names[:6], held_out]):
        (root / name).write_text("".join(_CODE.format(i=k * 10 + j) for j in range(6)), encoding="utf-8")
    return root


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Runs `python -m tools.train.train` in-process on a tiny corpus and the tiny `dspark` config."""
    monkeypatch.setattr(train, "default_model_config", lambda tokenizer: tiny_config("dspark"))
    # the drafter's acceptance evaluation on fewer, shorter continuations (64 new tokens cost seconds)
    monkeypatch.setattr(train, "acceptance", lambda model, prompts, new_tokens: acceptance(model, prompts, 6))
    tok = tmp_path / "tokenizer.json"
    build_synthetic_tokenizer().save(str(tok))
    corpus = _corpus(tmp_path / "lib")
    base = ["--corpus-root", str(corpus), "--tokenizer", str(tok), "--steps", "4", "--draft-steps", "4"]
    base += ["--batch", "2", "--seq", "12", "--warmup", "2", "--anchors", "2", "--log-every", "1"]
    base += ["--eval-windows", "2", "--device", "cpu", "--seed", "5"]

    def run(out: Path, *extra: str) -> None:
        train.main(["--out", str(out), *base, *extra])

    return run


def _untimed(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.endswith(TIMING)}


def _log(out: Path) -> list[dict]:
    return [_untimed(json.loads(line)) for line in (out / "log.jsonl").read_text().splitlines()]


def test_stopped_and_resumed_runs_match_one_run(cli, tmp_path: Path) -> None:
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    cli(whole)
    cli(parts, "--stop-after-steps", "2")  # stops in the target stage
    assert json.loads((parts / "log.jsonl").read_text().splitlines()[-1])["step"] == 2
    assert not (parts / "metrics.json").exists()
    state = parts / "state.pt"
    cli(parts, "--resume", str(state), "--stop-after-steps", "4")  # target ends, drafter stops at 2
    assert torch.load(state)["stage"] == "draft" and torch.load(state)["step"] == 2
    cli(parts, "--resume", str(state))

    a, b = torch.load(whole / "state.pt"), torch.load(state)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(
        torch.equal(x, y)
        for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values())
        for x, y in zip(sa.values(), sb.values())
    )
    assert all(torch.equal(a["rngs"][k], b["rngs"][k]) for k in ("batches", "anchors"))
    # every logged loss (target, held-out, drafter, hit rates), including those of the resumed halves
    log = _log(whole)
    assert [(r["stage"], r["step"]) for r in log] == [
        (s, i) for s in ("target", "draft") for i in range(1, 5)
    ]
    assert _log(parts) == log
    # as JSON text: empty calibration buckets are NaN
    metrics = [json.dumps(_untimed(json.loads((out / "metrics.json").read_text()))) for out in (whole, parts)]
    assert metrics[0] == metrics[1]
    shards = sorted(p.name for p in (whole / "checkpoint").glob("*.safetensors"))
    assert shards and all(
        (whole / "checkpoint" / n).read_bytes() == (parts / "checkpoint" / n).read_bytes() for n in shards
    )
