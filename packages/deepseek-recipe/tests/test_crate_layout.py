"""The Rust layout: a pure core crate whose modules form a DAG, and a bindings crate on top of it.

Reads the sources only (no build): the core is the crate at the package root (`src/`), the PyO3 bindings are
the `bindings/` crate that builds `deepseek_recipe._native`.
"""

from __future__ import annotations

import graphlib
import re
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
CORE_SRC = PACKAGE / "src"

CRATE_PATH = re.compile(r"\bcrate::(\w+|\{)")


def load_toml(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


def code_outside_tests(path: Path) -> str:
    """The file's code before its `#[cfg(test)]` module (always the file's tail here), comments removed."""
    text = path.read_text(encoding="utf-8").split("#[cfg(test)]", 1)[0]
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def grouped_names(code: str, start: int) -> list[str]:
    """The first segment of each path in the `{...}` group opening at `code[start]`."""
    depth, item, names = 0, "", []
    for ch in code[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and ch == ",":
            names.append(item)
            item = ""
        else:
            item += ch
    names.append(item)
    return [m.group(0) for n in names if (m := re.match(r"\w+", n.strip()))]


def top_module(path: Path) -> str:
    """`src/stream/parser.rs` and `src/stream/mod.rs` belong to `stream`; `src/tokens.rs` to `tokens`."""
    return path.relative_to(CORE_SRC).parts[0].removesuffix(".rs")


def core_module_graph() -> dict[str, set[str]]:
    """Each top-level core module -> the other top-level modules its non-test code names via `crate::`."""
    graph: dict[str, set[str]] = {}
    for path in sorted(CORE_SRC.rglob("*.rs")):
        if path == CORE_SRC / "lib.rs":
            continue
        module = top_module(path)
        deps = graph.setdefault(module, set())
        code = code_outside_tests(path)
        for m in CRATE_PATH.finditer(code):
            names = grouped_names(code, m.start(1)) if m.group(1) == "{" else [m.group(1)]
            deps.update(n for n in names if n != module)
    return graph


def test_core_modules_form_a_dag():
    graph = core_module_graph()
    assert {"conversation", "options", "response", "stream", "convert"} <= graph.keys()
    unknown = {dep for deps in graph.values() for dep in deps} - graph.keys()
    assert not unknown, f"crate:: paths to modules that are not top-level core modules: {sorted(unknown)}"
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"core module cycle: {' -> '.join(e.args[1])}") from None
    # The cycles this layout broke stay broken: options before conversation before response.
    assert order.index("options") < order.index("conversation") < order.index("response")


def test_grouped_crate_paths_are_edges():
    code = "use crate::{tokens::SpecialToken, options::{A, B}, error};"
    m = CRATE_PATH.search(code)
    assert grouped_names(code, m.start(1)) == ["tokens", "options", "error"]


def test_core_has_no_python_dependency():
    manifest = load_toml(PACKAGE / "Cargo.toml")
    assert "pyo3" not in manifest["dependencies"]
    assert "features" not in manifest, "the core needs no feature to leave Python out"
    offenders = [
        str(p.relative_to(PACKAGE)) for p in CORE_SRC.rglob("*.rs") if "pyo3" in p.read_text(encoding="utf-8")
    ]
    assert not offenders, f"PyO3 in the core: {offenders}"


def test_bindings_crate_builds_the_python_module_on_the_core():
    bindings = load_toml(PACKAGE / "bindings" / "Cargo.toml")
    assert bindings["dependencies"]["deepseek-recipe"] == {"path": ".."}
    assert "pyo3" in bindings["dependencies"]
    maturin = load_toml(PACKAGE / "pyproject.toml")["tool"]["maturin"]
    assert maturin["manifest-path"] == "bindings/Cargo.toml"
    assert maturin["module-name"] == "deepseek_recipe._native"
    assert "bindings" in load_toml(PACKAGE / "Cargo.toml")["workspace"]["members"]
