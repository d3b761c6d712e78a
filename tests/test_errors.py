"""Every error ethplus raises on purpose has one base, which carries the
exit code; the CLI prints it in one line, never a traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import dataplane
from dataplane.errors import EXIT_USAGE, EthplusError, UsageError


def _modules():
    for m in pkgutil.walk_packages(dataplane.__path__, "dataplane."):
        if not m.name.rsplit(".", 1)[1].startswith("_"):
            yield importlib.import_module(m.name)


def test_every_error_class_has_the_one_base():
    errors = [
        (mod.__name__, name, obj)
        for mod in _modules()
        for name, obj in vars(mod).items()
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == mod.__name__
    ]
    assert len(errors) >= 10
    strays = [f"{m}.{n}" for m, n, c in errors if not issubclass(c, EthplusError)]
    assert not strays, f"errors outside EthplusError: {strays}"


def test_bad_input_exits_with_the_usage_code_and_one_line(tmp_path, capsys):
    from cli.main import main
    from dataplane.model.labfile import LabFileError
    from dataplane.model.topology import TopologyError

    assert issubclass(LabFileError, UsageError) and issubclass(TopologyError, UsageError)
    f = tmp_path / "bad.toml"
    f.write_text('[lab]\nfamily = "nosuch"\n')
    assert main(["lab", "up", str(f)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("ethplus: error: ") and err.count("\n") == 1, err
    assert str(f) in err and "family" in err


@pytest.mark.parametrize("k", ["0.5", "inf", "nan"])
def test_a_bad_time_scale_to_bench_is_refused_before_any_lab_is_built(k, tmp_path, capsys):
    """bench/compare --time-scale used to reach lab.session unchecked."""
    from conftest import RUN_ID

    from cli.main import main
    from dataplane.lab import registry

    name = f"{RUN_ID}-ts"
    src = open("netns-labs/erack-8x4.toml").read().replace("[lab]", f'[lab]\nname = "{name}"', 1)
    f = tmp_path / "lab.toml"
    f.write_text(src)
    before = set(registry.names())
    assert main(["bench", "all-reduce", "--lab", str(f), "--time-scale", k]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--time-scale" in err and "a number >= 1" in err and err.count("\n") == 1, err
    assert set(registry.names()) == before
