"""The package's layers: no import cycle between its modules (imports
inside functions count too), and the model (lab files, topology, the
transport interface, a job's in-network plan, the governor's decisions)
loads without the compiled C or root."""

from __future__ import annotations

import ast
import pathlib
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


def test_no_import_cycle():
    graph = _imports()
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
        if m not in state:
            cycle = visit(m, [m])
            assert cycle is None, " -> ".join(cycle)


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
    ],
)
def test_the_model_loads_without_the_compiled_core(module):
    code = (
        f"import sys, dataplane.{module}\n"
        "assert 'dataplane._ethp' not in sys.modules, sorted(sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr
