"""Batch-invariant mode plumbing (CPU): binding of kernels' `batch_invariant`, the row-wise rule and its
errors, and the flag from the CLI through LLM / EngineConfig / RuntimeOptions to get_ops."""

from pathlib import Path

import pytest
import torch

from deepinfer.entrypoints.cli.engine_args import llm_from_args
from deepinfer.entrypoints.cli.main import build_parser
from deepinfer.entrypoints.llm import LLM
from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, build_runtime
from deepinfer.ops import Backend, BackendError, get_ops
from deepinfer.ops import registry as ops_registry
from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.ops.reference.backend import ReferenceBackend
from deepinfer.ops.registry import invariant_ops
from deepinfer.sampling import SamplingParams
from deepinfer.testing.configs import tiny_config

MODEL = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-stdlib"
REFERENCE_ROW_WISE = ReferenceBackend.row_wise
PREPARE = frozenset({"prepare_linear", "prepare_experts"})  # load-time: no rows at all


def _with_mode(fn, calls: list[str], name: str):
    """`fn` with a keyword-only batch_invariant that records the calls made in invariant mode."""

    def op(*args, batch_invariant: bool = False, **kwargs):
        if batch_invariant:
            calls.append(name)
        return fn(*args, **kwargs)

    return op


class _InvariantBackend(Backend):
    """Weight preparation, and every op that is not row-wise on reference with an invariant mode (minus
    `lacking`)."""

    package = "test"
    priority = 1000

    def __init__(self, name: str, lacking: frozenset[str] = frozenset()):
        self.name, self.lacking = name, lacking
        self.calls: list[str] = []

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def ops(self, *, batch_invariant: bool = False):
        table = {n: _with_mode(fn, self.calls, n) for n, fn in REFERENCE_OPS.items()
                 if n not in REFERENCE_ROW_WISE and n not in self.lacking}
        table |= {n: REFERENCE_OPS[n] for n in PREPARE}
        return invariant_ops(table, PREPARE) if batch_invariant else table


class _OldBackend(Backend):  # a plugin written before the mode existed
    name = "old"
    package = "test"

    def supports(self, device: torch.device) -> bool:
        return True

    def ops(self):
        return {"rms_norm": REFERENCE_OPS["rms_norm"]}


@pytest.fixture
def backends(monkeypatch):
    installed = {"reference": ReferenceBackend(), "inv": _InvariantBackend("inv"), "old": _OldBackend(),
                 "half": _InvariantBackend("half", lacking=frozenset({"moe", "rms_norm"}))}
    monkeypatch.setattr(ops_registry, "available_backends", lambda: installed)
    ops_registry._resolve.cache_clear()
    yield installed
    ops_registry._resolve.cache_clear()


def test_invariant_ops_binds_the_keyword_and_keeps_only_row_wise_others():
    def tiled(x, *, batch_invariant: bool = False):
        return x, batch_invariant

    def positional(x, batch_invariant=False):  # not keyword-only: not a declared mode
        return x

    table = invariant_ops({"tiled": tiled, "positional": positional, "norm": abs, "other": abs}, {"norm"})
    assert sorted(table) == ["norm", "tiled"]
    assert table["tiled"](3) == (3, True)
    assert table["norm"] is abs


def test_get_ops_binds_invariant_kernels_and_falls_back_to_row_wise_reference(backends):
    ops = get_ops("inv", "cpu", batch_invariant=True)
    assert ops.batch_invariant and not get_ops("inv", "cpu").batch_invariant
    assert set(ops.fallbacks) == REFERENCE_ROW_WISE - PREPARE
    x = torch.randn(3, 8)
    ops.rms_norm(x, torch.ones(8), 1e-6)
    assert backends["inv"].calls == ["rms_norm"]
    assert ops.rope_interleaved is REFERENCE_OPS["rope_interleaved"]
    get_ops("inv", "cpu").rms_norm(x, torch.ones(8), 1e-6)  # default mode: the kernel's own choice
    assert backends["inv"].calls == ["rms_norm"]


def test_ops_without_an_invariant_version_are_named(backends):
    with pytest.raises(BackendError, match=r"'half' provides \['linear', 'prepare_experts', "
                                           r"'prepare_linear'\] but not \['moe'\] in batch-invariant mode"):
        get_ops("half", "cpu", batch_invariant=True)
    backends["half"].lacking = frozenset({"rms_norm", "engram_gate"})
    ops_registry._resolve.cache_clear()
    with pytest.raises(BackendError, match=r"'half' on cpu cannot run \['engram_gate', 'rms_norm'\] "
                                           "batch-invariantly"):
        get_ops("half", "cpu", batch_invariant=True)
    with pytest.raises(BackendError, match=r"'reference' on cpu cannot run \[.*'linear', 'moe'.*\]"):
        get_ops("reference", "cpu", batch_invariant=True)
    with pytest.raises(BackendError, match=r"'old' .* has no batch-invariant mode"):
        get_ops("old", "cpu", batch_invariant=True)
    assert get_ops("old", "cpu").rms_norm is REFERENCE_OPS["rms_norm"]  # default mode unaffected


def test_runtime_refuses_invariant_options_with_default_ops():
    config = tiny_config("swa_only")
    with pytest.raises(ValueError, match="batch_invariant needs ops from get_ops"):
        build_runtime(config, {"x": torch.zeros(1)}, ops=get_ops("reference"),
                      options=RuntimeOptions(batch_invariant=True))


def test_cli_flag_reaches_llm(monkeypatch):
    seen = {}
    monkeypatch.setattr("deepinfer.entrypoints.llm.LLM", lambda model, **kw: seen.update(kw))
    for command in (["generate", "--prompt", "hi"], ["bench"], ["serve"], ["chat"]):
        seen.clear()
        llm_from_args(build_parser().parse_args([*command, "--model", "m", "--batch-invariant"]))
        assert seen["batch_invariant"] is True, command
    llm_from_args(build_parser().parse_args(["bench", "--model", "m"]))
    assert seen["batch_invariant"] is False


def test_llm_flag_selects_invariant_ops_for_model_and_sampler(backends):
    with pytest.raises(BackendError, match=r"'reference' on cpu cannot run \[.*'linear'"):
        LLM(MODEL, backend="reference", batch_invariant=True, max_num_seqs=2, cache_bytes=1 << 24)
    llm = LLM(MODEL, backend="inv", batch_invariant=True, max_num_seqs=2, cache_bytes=1 << 24)
    try:
        assert llm.engine.model.model.ops.batch_invariant
        assert llm.engine.runner.sampler.ops.batch_invariant
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0))
        assert {"linear", "moe", "rms_norm"} <= set(backends["inv"].calls)
    finally:
        llm.close()
