"""The backend registry (``tbs.backends.REGISTRY``): one row per backend, no name falls through.

No framework is started here: the registry, the refusals and the folder contract are read
without importing TensorFlow or JAX.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tbs import backends
from tbs.cli import cli
from tbs.errors import TbsError

KNOWN = ", ".join(backends.BACKENDS)


@pytest.mark.parametrize("call", [backends.discover, backends.choose, backends.installed, backends.check,
                                  lambda name: backends.environment(name, False), backends.backend])
def test_an_unknown_backend_is_refused_by_every_entry_point(call) -> None:
    # Before the registry, discover('torch') and environment('torch', ...) fell through to TensorFlow.
    with pytest.raises(TbsError) as caught:
        call("torch")
    message = str(caught.value)
    assert "'torch'" in message and KNOWN in message and "\n" not in message


@pytest.mark.parametrize("args", [["profile", "model.pkl", "--backend", "torch"], ["devices", "--backend", "torch"]])
def test_an_unknown_backend_on_the_command_line_is_one_line_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "torch" in lines[0], result.output
    assert all(name in lines[0] for name in backends.BACKENDS)


def test_every_backend_folder_has_the_same_files_and_entry_points() -> None:
    """Adding a backend is a folder with these file names, one registry row and tests."""
    for name in backends.BACKENDS:
        folder = Path(backends.backend(name).module("environment").__file__).parent
        assert set(backends.FILES) <= {p.name for p in folder.glob("*.py")}, (name, sorted(folder.glob("*.py")))
    for row in backends.REGISTRY.values():
        environment = row.module("environment")  # imports no framework: its imports are lazy
        for entry in ("configure", "before_keras", "versions", "settings"):
            assert callable(getattr(environment, entry, None)), (row.name, entry)


def test_the_registry_answers_what_the_rest_of_tbs_asks() -> None:
    assert backends.DEFAULT in backends.REGISTRY
    assert backends.short("tensorflow") == "tf" and backends.short("elsewhere") == "elsewhere"
    assert backends.fused_gpu_rnn_types("tensorflow") == ("LSTM", "GRU")
    assert backends.fused_gpu_rnn_types("jax") == ("LSTM",)  # Keras on JAX: cuDNN's LSTM, seen on an H200
    assert backends.fused_gpu_rnn_types("recorded-elsewhere") == ()
    assert [b.name for b in backends.REGISTRY.values() if b.always_xla] == ["jax"]
    assert [b.name for b in backends.REGISTRY.values() if not b.string_ops] == ["jax"]


def test_no_backend_folder_has_a_circle_even_in_type_hints() -> None:
    """device.py uses training.py and split.py; they must not reach back into device.py (issue 32: the TF
    backend's training.py called TFDevice._blocked, so the two were halves of one class). Their shared
    runner lives in its own module (tensorflow/loop.py)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_imports import PACKAGE_DIR, collect, find_cycles

    modules = collect(PACKAGE_DIR)
    for row in backends.REGISTRY.values():
        inside = {name: m for name, m in modules.items() if name.startswith(row.package + ".")}
        graph = {name: {i.target for i in m.imports if i.target in inside and i.target != name}
                 for name, m in inside.items()}
        assert find_cycles(graph) == [], (row.name, find_cycles(graph))
