"""Installing / uninstalling a backend or speculator package changes what deepinfer discovers.

"Installing" here is what an installer leaves behind for importlib.metadata: the package's files and
a `.dist-info` folder with its entry points, on sys.path. We build exactly that from the toy package
in tests/plugins/toy-backend, so the test needs no network and no build backend.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from deepinfer.ops import BackendError, available_backends, get_ops
from deepinfer.ops import registry as ops_registry
from deepinfer.speculators import SpeculatorError, available_speculators, get_speculator

TOY = Path(__file__).parent / "plugins" / "toy-backend"


def _install(site: Path) -> None:
    project = tomllib.loads((TOY / "pyproject.toml").read_text())["project"]
    shutil.copytree(TOY / "src" / "deepinfer_toy_backend", site / "deepinfer_toy_backend")
    dist_info = site / f"deepinfer_toy_backend-{project['version']}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def _forget_discoveries() -> None:
    available_backends.cache_clear()
    ops_registry._resolve.cache_clear()
    available_speculators.cache_clear()
    sys.modules.pop("deepinfer_toy_backend", None)


@pytest.fixture
def toy_installed(tmp_path, monkeypatch):
    _install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DEEPINFER_BACKEND", raising=False)
    _forget_discoveries()
    yield
    monkeypatch.undo()
    _forget_discoveries()


def test_reference_backend_is_always_there():
    backends = available_backends()
    assert "reference" in backends
    ops = get_ops("reference", "cpu")
    x = torch.randn(3, 8)
    w = torch.rand(8)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), expected)


def test_installing_a_backend_makes_it_discovered_and_preferred(toy_installed):
    assert "toy" in available_backends()
    ops = get_ops(device="cpu")  # toy outranks reference on CPU
    assert ops.backend_name == "toy"
    assert torch.equal(ops.rms_norm(torch.zeros(2, 4), torch.ones(4), 1e-6), torch.full((2, 4), 7.0))


def test_ops_the_backend_lacks_fall_back_to_reference(toy_installed, monkeypatch):
    reference_names = set(get_ops("reference").names)
    ops = get_ops("toy", "cpu")
    assert set(ops.fallbacks) == reference_names - {"rms_norm"}
    for name in ops.fallbacks:
        assert getattr(ops, name) is getattr(get_ops("reference"), name)


def test_uninstalled_backend_is_gone():
    _forget_discoveries()
    assert "toy" not in available_backends()
    with pytest.raises(BackendError, match="'toy' is not installed"):
        get_ops("toy")


def test_asking_for_a_missing_known_backend_names_the_package(monkeypatch):
    only_reference = {"reference": available_backends()["reference"]}
    monkeypatch.setattr(ops_registry, "available_backends", lambda: only_reference)
    hint = r"install deepinfer-kernels-cuda \(pip install 'deepinfer-core\[cuda\]'\)"
    with pytest.raises(BackendError, match=hint):
        get_ops("cuda", "cpu")


def test_installed_backend_refuses_a_device_it_does_not_support():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(BackendError, match=r"'cuda' .* does not support device cpu"):
        get_ops("cuda", "cpu")


def test_environment_variable_selects_backend(toy_installed, monkeypatch):
    monkeypatch.setenv("DEEPINFER_BACKEND", "reference")
    assert get_ops(device="cpu").backend_name == "reference"


def test_backend_must_support_the_device(toy_installed):
    with pytest.raises(BackendError, match=r"'toy' .* does not support device meta"):
        get_ops("toy", "meta")


def test_unknown_op_is_a_clear_error():
    with pytest.raises(AttributeError, match="not in the deepinfer op set"):
        get_ops("reference").no_such_op  # noqa: B018


def test_speculators_are_discovered_the_same_way(toy_installed):
    assert get_speculator("toy-draft").__name__ == "ToySpeculator"


def test_missing_speculator_names_the_extra():
    _forget_discoveries()
    assert {"dspark", "ngram"} <= set(available_speculators())  # deepinfer-spec's entry points
    with pytest.raises(SpeculatorError, match=r"deepinfer-core\[spec\]"):
        get_speculator("medusa")
