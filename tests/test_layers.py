"""The package's layers: its folders are layers that import downwards only
(base < model < report < lab < run < cli), no import cycle between its
modules (imports inside functions count too), the model and the reports
load without the compiled C or root, and only the C objects' wrappers touch
the raw cffi; the NIC engine's C files call down only."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "dataplane"
# A module's layer is its folder (the package's own modules are the base).
LAYERS = ("base", "model", "report", "lab", "run", "cli")


def _name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _sources() -> dict[str, pathlib.Path]:
    paths = [*PKG.rglob("*.py"), *(ROOT / "cli").glob("*.py")]
    return {
        _name(p): p
        for p in paths
        if p.name != "__init__.py" and "csrc" not in p.parts and not p.name.startswith("_")
    }


def _imported(path: pathlib.Path) -> set[str]:
    """The dotted names a module imports (a `from P import m` counts as P.m)."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            deps.add(node.module)
            deps |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
    return deps


def _imports() -> dict[str, set[str]]:
    mods = _sources()
    return {m: (_imported(p) & set(mods)) - {m} for m, p in mods.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "cli":
        return "cli"
    return parts[1] if len(parts) > 2 else "base"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph (a path back to where it started), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d]
            if d not in state and (c := visit(d, path + [d])):
                return c
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m, [m])):
            return c
    return None


def test_no_import_cycle():
    cycle = _cycle(_imports())
    assert cycle is None, " -> ".join(cycle)


def test_every_folder_is_a_layer_that_imports_downwards_only():
    graph = _imports()
    assert {_layer(m) for m in graph} == set(LAYERS)
    upward = [
        f"{m} ({_layer(m)}) imports {d} ({_layer(d)})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if LAYERS.index(_layer(d)) > LAYERS.index(_layer(m))
    ]
    assert not upward, "\n".join(upward)


CSRC = PKG / "csrc"
NIC_FILES = sorted(CSRC.glob("nic*.c"))


def _nic_calls() -> dict[str, set[str]]:
    """Which of the NIC engine's files each calls (its nic_ functions)."""
    defs = {}
    for f in NIC_FILES:
        for m in re.finditer(r"(?m)^[a-z][\w \*]*?\b(nic_\w+)\(", f.read_text()):
            defs[m.group(1)] = f.name
    return {
        f.name: {defs[c] for c in re.findall(r"\b(nic_\w+)\(", f.read_text()) if c in defs}
        - {f.name}
        for f in NIC_FILES
    }


def test_the_nic_engines_parts_call_down_only():
    """nic.c (the loop) on top, a mode's file above what both modes share,
    nic_base.c at the bottom: no two files call each other, directly or
    around a cycle (a mode is reached through its nic_mode_ops)."""
    calls = _nic_calls()
    assert {"nic.c", "nic_ethp.c", "nic_roce.c", "nic_tx.c", "nic_rx.c", "nic_credits.c",
            "nic_inc.c", "nic_base.c"} <= set(calls)  # fmt: skip
    cycle = _cycle(calls)
    assert cycle is None, " -> ".join(cycle)
    assert not calls["nic_base.c"]
    assert "nic_roce.c" not in set().union(*calls.values())  # only through its ops


def test_the_roce_mode_is_its_ops_not_branches():
    """Outside the constructor and the checks of a configuration, no part
    of the engine asks whether it runs RoCE: the mode's ops say."""
    for f in NIC_FILES:
        text = re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S)  # comments
        for ctor in ("ethp_nic_new_io", "ethp_nic_inc_setup"):
            text = re.sub(r"(?ms)^\S[^\n]*\b" + ctor + r"\(.*?^}", "", text)
        assert not re.findall(r"cfg(?:->|\.)roce\b", text), f.name


PURE = sorted(
    m
    for m in _sources()
    if _layer(m) in ("base", "model", "report")
    or m in ("dataplane.run.transport", "dataplane.run.inc", "dataplane.lab.governor",
             "dataplane.lab.fabric_client")
)  # fmt: skip


@pytest.mark.parametrize("module", PURE)
def test_the_model_loads_without_the_compiled_core(module):
    code = (
        f"import sys, {module}\nassert 'dataplane._ethp' not in sys.modules, sorted(sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


# The modules that wrap one C object each and take the raw ffi and lib from
# core (core.py says why); every other module uses core's typed wrappers.
OWNER = "dataplane.lab.core"
RAW_C = {OWNER, "dataplane.lab.nic", "dataplane.lab.memfabric", "dataplane.lab.clock",
         "dataplane.lab.capture", "dataplane.run.fuzz"}  # fmt: skip


def test_only_the_c_objects_wrappers_touch_the_raw_cffi():
    """The compiled extension is imported by its owner alone, and its raw
    ffi and lib reach only the wrappers of single C objects."""
    for m, path in _sources().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            names = {a.name for a in node.names}
            if node.module == "dataplane._ethp" or (
                node.module == "dataplane" and "_ethp" in names
            ):
                assert m == OWNER, f"{m} imports the compiled extension"
            if node.module == OWNER:
                raw = names & {"ffi", "lib"}
                assert not raw or m in RAW_C, f"{m} imports {raw} from {OWNER}"
