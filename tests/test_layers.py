"""The package's layers: no import cycle between its modules (imports
inside functions count too), and the model (lab files, topology, the
transport interface, a job's in-network plan, the governor's decisions)
loads without the compiled C or root; the NIC engine's C files call down
only."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "dataplane"


def _imports() -> dict[str, set[str]]:
    mods = {p.stem for p in PKG.glob("*.py")}
    graph = {}
    for m in mods:
        deps = set()
        for node in ast.walk(ast.parse((PKG / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "dataplane":
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dataplane."):
                deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps |= {
                    a.name.split(".")[1] for a in node.names if a.name.startswith("dataplane.")
                }
        graph[m] = deps & mods - {m}
    return graph


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


@pytest.mark.parametrize(
    "module",
    [
        "labfile",
        "topology",
        "transport",
        "inc",
        "governor",
        "units",
        "fabric_client",
        "scenario_file",
        "scale",
    ],
)
def test_the_model_loads_without_the_compiled_core(module):
    code = (
        f"import sys, dataplane.{module}\n"
        "assert 'dataplane._ethp' not in sys.modules, sorted(sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr


# The modules that wrap one C object each and take the raw ffi and lib from
# core (core.py says why); every other module uses core's typed wrappers.
RAW_C = {"core", "nic", "memfabric", "clock", "capture", "fuzz"}


def test_only_the_c_objects_wrappers_touch_the_raw_cffi():
    for path in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in (
                "dataplane.core",
                "dataplane._ethp",
            ):
                raw = {a.name for a in node.names} & {"ffi", "lib"}
                assert not raw or path.stem in RAW_C, (
                    f"{path.name} imports {raw} from {node.module}"
                )
