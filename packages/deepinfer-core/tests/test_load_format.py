"""`--load-format dummy`: random weights from config.json alone (make-checkpoint --config-only), the clear
error of `auto` on a directory without weights, option parsing, and `deepinfer bench`'s workloads."""

from __future__ import annotations

import json

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.checkpoint import CheckpointError, iter_inventory, load_checkpoint
from deepinfer.checkpoint.randomize import random_weights
from deepinfer.engine.loader import load_model
from deepinfer.entrypoints.cli.main import build_parser, main
from deepinfer.entrypoints.llm import SettingError
from deepinfer.testing import tiny_config

SMALL = dict(device="cpu", max_model_len=64, max_num_seqs=4, cache_bytes=16 << 20)


@pytest.fixture(scope="module")
def config_only(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("config-only")
    assert main(["make-checkpoint", "--config", "full", "--config-only", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "tokenizer.json", "tokenizer_config.json"}
    return str(out)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def test_dummy_load_generates_through_llm(config_only):
    llm = LLM(config_only, load_format="dummy", **SMALL)
    try:
        out = llm.generate(["def f(x):", "import os"], SamplingParams(max_tokens=5, temperature=0,
                                                                      ignore_eos=True), use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in out] == [5, 5]
        assert all(o.outputs[0].finish_reason == "length" for o in out)
        # the uniform FP4 experts' scales keep activations in range: finite logits, not all equal
        logits = llm.engine.model.score([[0, 5, 17, 33, 2]])[0]
        assert torch.isfinite(logits).all() and logits.std() > 0.1
        greedy = out[0].outputs[0].token_ids
    finally:
        llm.close()
    other = LLM(config_only, load_format="dummy", seed=1, **SMALL)  # the weights come from the engine seed
    try:
        again = other.generate("def f(x):", SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
                               use_tqdm=False)[0].outputs[0].token_ids
    finally:
        other.close()
    assert again != greedy


def test_random_weights_are_the_release_inventory_and_seeded(tmp_path):
    config = tiny_config("full")
    a, b, c = (random_weights(config, "cpu", seed) for seed in (0, 0, 1))
    specs = list(iter_inventory(config))
    assert set(a) == {s.name for s in specs}
    for s in specs:
        assert tuple(a[s.name].shape) == s.shape and a[s.name].element_size() * a[s.name].numel() == s.nbytes
        assert torch.equal(bits(a[s.name]), bits(b[s.name]))
    assert not torch.equal(a["head.weight"], c["head.weight"])
    # every tensor but the packed FP4 experts (uniform bytes) has the values make-checkpoint writes
    main(["make-checkpoint", "--config", "full", "--out", str(tmp_path), "--quiet", "--single-file"])
    written = load_checkpoint(tmp_path, progress=False).tensors
    fp4 = {n for s in specs if s.kind == "fp4" for n in (s.name, s.name.removesuffix("weight") + "scale")}
    assert all(torch.equal(bits(written[n]), bits(a[n])) for n in a if n not in fp4)


def test_config_only_dir_needs_dummy(config_only, capsys):
    with pytest.raises(CheckpointError, match=r"no weights.*model\.safetensors.*--load-format dummy"):
        LLM(config_only, **SMALL)
    assert main(["generate", "--model", config_only, "--device", "cpu", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert "no weights" in err and "--load-format dummy" in err and "Traceback" not in err


def test_load_format_options(config_only, capsys):
    parser = build_parser()
    assert parser.parse_args(["bench", "--model", "m"]).load_format == "auto"
    assert parser.parse_args(["generate", "--model", "m", "--load-format", "dummy"]).load_format == "dummy"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--model", "m", "--load-format", "npz"])
    assert exc.value.code == 2 and "'auto', 'dummy'" in capsys.readouterr().err
    with pytest.raises(SettingError, match=r"load_format: .*'auto' or 'dummy'"):
        LLM(config_only, load_format="npz", **SMALL)
    with pytest.raises(ValueError, match=r"load_format must be one of auto, dummy, got 'npz'"):
        load_model(config_only, load_format="npz")
    argv = ["generate", "--model", config_only, "--prompt", "hi", "--load-format", "dummy", "--dp", "2"]
    assert main(argv) == 2 and "--load-format dummy: not supported with --dp" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--load-format {auto,dummy}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["make-checkpoint", "--help"])
    assert "--config-only" in capsys.readouterr().out


def test_bench_workloads_on_dummy_weights(config_only, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--log-level", "WARNING", "bench", "--model", config_only, "--load-format", "dummy",
            "--device", "cpu", "--num-requests", "1", "2", "--input-len", "24", "8", "--output-len", "5",
            "--len-dist", "fixed", "--overhead-batches", "2", "--overhead-steps", "2", "--warmup",
            "--max-num-seqs", "4", "--cache-mb", "16", "--json-out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    single, pair = result["throughput"]
    (overhead,) = result["overhead"]
    assert overhead["running"] == 2 and overhead["step_s"] > 0
    assert (single["requests"], single["input_len"], pair["requests"], pair["input_len"]) == (1, 24, 2, 8)
    assert single["prefill_steps"] == 1 and single["prefill_tok_s"] > 0  # 24 tokens in one step
    assert (single["decode_batch"], pair["decode_batch"]) == (1, 2)
    assert single["decode_steps"] >= 2 and single["decode_step_s"] >= single["decode_busy_s"] > 0
    assert "prefill" in capsys.readouterr().out
    argv = ["bench", "--model", config_only, "--num-requests", "1", "2", "3", "--input-len", "4", "5"]
    assert main(argv) == 2
    assert "--input-len: 2 values for 3 workloads" in capsys.readouterr().err
