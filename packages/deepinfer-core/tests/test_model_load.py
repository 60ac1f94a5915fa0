"""Loading a model through the registry: bad checkpoints fail at load naming the tensor; `deepinfer score`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepinfer.entrypoints.cli.main import main
from deepinfer.models.deepseek_v41.weights import WeightError
from deepinfer.models.registry import load_model
from deepinfer.testing import write_tiny_checkpoint

FILE = "model.safetensors"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint("c2", tmp_path_factory.mktemp("c2"), seed=3)


def _damaged(good: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "bad"
    out.mkdir()
    for f in good.iterdir():
        if f.name != FILE:
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(good / FILE)
    edit(tensors)
    save_file(tensors, out / FILE)
    return out


def _nan_scale(t: dict[str, torch.Tensor]) -> None:
    s = t["layers.1.attn.wq_b.scale"].view(torch.uint8).clone()
    s[0, 0] = 0xFF
    t["layers.1.attn.wq_b.scale"] = s.view(torch.float8_e8m0fnu)


@pytest.mark.parametrize(
    ("edit", "tensor"),
    [
        (lambda t: t.pop("layers.2.attn.wkv.weight"), "layers.2.attn.wkv.weight"),
        (
            lambda t: t.update({"layers.0.ffn.gate.weight": t["layers.0.ffn.gate.weight"][:-1]}),
            "layers.0.ffn.gate.weight",
        ),
        (_nan_scale, "layers.1.attn.wq_b.scale"),
    ],
    ids=["missing", "wrong-shape", "nan-scale"],
)
def test_bad_checkpoint_fails_at_load_naming_the_tensor(good, tmp_path, edit, tensor) -> None:
    bad = _damaged(good, tmp_path, edit)
    with pytest.raises(ValueError, match=tensor.replace(".", r"\.")):
        load_model(bad)


def test_model_binding_checks_what_the_loader_does_not(good) -> None:
    # the model's own checks (used for in-memory tensors, e.g. benchmarks) name the tensor too
    from deepinfer.config import load_model_config
    from deepinfer.models.deepseek_v41.runtime import build_runtime

    tensors = dict(load_file(good / FILE))
    tensors["layers.1.ffn.experts.3.w2.weight"] = tensors["layers.1.ffn.experts.3.w2.weight"][:, :-1]
    with pytest.raises(WeightError, match=r"^layers\.1\.ffn\.experts\.3\.w2\.weight: shape"):
        build_runtime(load_model_config(good / "config.json"), tensors)


def test_unknown_architecture_is_rejected(good, tmp_path) -> None:
    cfg = json.loads((good / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        load_model(tmp_path)


def test_score_cli_writes_full_sequence_logits(good, tmp_path) -> None:
    prompts = {"a": [5, 9, 11, 200, 7], "b": [3, 4]}
    (tmp_path / "p.json").write_text(json.dumps(prompts))
    out = tmp_path / "logits.safetensors"
    assert main(["score", "--model", str(good), "--input", str(tmp_path / "p.json"), "--out", str(out)]) == 0
    logits = load_file(out)
    assert logits["a"].shape == (5, 762) and logits["b"].shape == (2, 762)
    assert logits["a"].dtype == torch.float32
    # the prefix of a prompt scores the same as alone (causal, stateless between prompts)
    torch.testing.assert_close(logits["a"][:2], load_model(good).score([[5, 9]])[0], atol=1e-5, rtol=0)
    (tmp_path / "l.json").write_text(json.dumps([[5, 9, 11]]))
    assert (
        main(
            [
                "score",
                "--model",
                str(good),
                "--input",
                str(tmp_path / "l.json"),
                "--out",
                str(out),
                "--dtype",
                "bfloat16",
                "--cache-precision",
                "release",
                "--chunk",
                "2",
            ]
        )
        == 0
    )
    assert load_file(out)["prompt.0"].shape == (3, 762)
