"""The oldest torch layerprof runs on (``layerprof._version.MIN_TORCH``, pyproject.toml's ``torch>=``): an older one
is refused as layerprof is imported, and the torch behaviours that set the floor hold on the torch under test."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from layerprof._version import LIVE_BYTES_TORCH, MIN_TORCH, check_torch, torch_release

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version,release", [
    ("2.10.0", (2, 10)), ("2.14.1+cu130", (2, 14)), ("2.13.0+cpu", (2, 13)), ("2.11.0.dev20260101", (2, 11)),
    ("2.9.1+cu128", (2, 9)), ("10.0", (10, 0)), ("", None), ("unknown", None),
])
def test_a_torch_version_is_read_as_its_major_and_minor(version: str, release: tuple[int, int] | None) -> None:
    assert torch_release(version) == release


@pytest.mark.parametrize("version", ["2.8.0+cu128", "2.6.0", "2.1.0", "1.13.1"])
def test_an_older_torch_is_refused_naming_both_versions(version: str) -> None:
    with pytest.raises(ImportError) as info:
        check_torch(version)
    assert f"torch {version}" in str(info.value) and "torch 2.9 or newer" in str(info.value)


@pytest.mark.parametrize("version", ["2.9.0", "2.9.1+cu128", "2.10.0a0+git1234", "2.14.1+cu130", "3.0.0", "",
                                     "custom"])
def test_the_floor_and_newer_or_unreadable_versions_pass(version: str) -> None:
    check_torch(version)


@pytest.mark.parametrize("version, refused", [("2.9.1+cu128", True), ("2.9.0", True), ("2.10.0", False),
                                               ("2.14.1+cu130", False), ("custom", False)])
def test_the_live_bytes_meter_is_refused_on_torch_2_9_as_the_profiler_is_made(
        monkeypatch: pytest.MonkeyPatch, version: str, refused: bool) -> None:
    # On torch 2.9 layerprof runs, but the CPU live-bytes reader would read wrong figures (below): the meter is
    # refused as LayerProf is made, naming the version, what goes wrong and what to use instead.
    import layerprof

    monkeypatch.setattr(torch, "__version__", version)
    model = torch.nn.Linear(2, 2)
    if not refused:
        layerprof.LayerProf(model, metrics=("live_memory",))
        return
    with pytest.raises(ValueError, match=rf"metrics=\('live_memory',\) needs torch 2\.10 or newer, and this "
                                         rf"environment has torch {re.escape(version)}: .*metrics=\('memory',\)"):
        layerprof.LayerProf(model, metrics=("live_memory",))
    layerprof.LayerProf(model, metrics=("memory", "flops"))  # the rest runs there


def test_the_floor_is_the_one_pyproject_declares() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'"torch>=([\d.]+)"', pyproject)
    assert declared is not None and torch_release(declared.group(1)) == MIN_TORCH
    assert torch_release(torch.__version__) >= MIN_TORCH  # the suite itself runs on a supported torch


def test_import_layerprof_on_an_older_torch_raises_before_touching_it(tmp_path: Path) -> None:
    # A stand-in torch of an old version (no _C at all): the package's first statements after importing torch
    # refuse it, before any private API is read (which would raise AttributeError, or worse, run).
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "2.8.0+cu128"\n', encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", "import layerprof"], capture_output=True, text=True,
                          env=environment, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: layerprof ") and "needs torch 2.9 or newer" in last, done.stderr[-2000:]
    assert "this environment has torch 2.8.0+cu128" in last


# -- what sets the floor: each fails on the torch releases below it -------------------------------------------------
def test_a_storage_weak_ref_does_not_keep_a_freed_storages_python_object() -> None:
    # The memory meter holds a StorageWeakRef on every storage it has seen (so that its address is not reused
    # within a forward); the live-bytes reader sees a storage freed when the storage's Python object goes. Through
    # torch 2.9 the weak reference kept that object alive: with metrics=("live_memory",) nothing seen was ever
    # freed in the reader's figures, and the checkpoint planner's peak budgets were wrong: the meter is refused
    # there (``LIVE_BYTES_TORCH``).
    tensor = torch.ones(256)
    storage = tensor.untyped_storage()
    freed: list[int] = []
    watch = weakref.ref(storage, lambda _: freed.append(1))
    held = StorageWeakRef(storage)
    del storage, tensor
    assert held.expired()
    # Freed from the release the meter asks for on; kept alive below it, which is why it is refused there.
    kept = freed != [1]
    assert kept == (torch_release(torch.__version__) < LIVE_BYTES_TORCH), (torch.__version__, kept)
    assert kept or watch() is None


def test_dispatch_modes_take_the_options_the_meters_set() -> None:
    # The FLOP meter's and the live-bytes reader's modes run flex attention (a higher-order op) and compiled
    # functions inside a forward as they run unprofiled; torch 2.8 and older have neither option (flex attention
    # raised under the modes, a compiled function ran eagerly).
    assert hasattr(TorchDispatchMode, "supports_higher_order_operators")
    assert callable(getattr(TorchDispatchMode, "ignore_compile_internals", None))


def test_module_calls_go_through_call_impl() -> None:
    # A block times module calls by putting its function in place of Module._call_impl: that holds only while
    # Module.__call__ is _wrapped_call_impl and it looks _call_impl up on the module at each call.
    assert vars(torch.nn.Module)["__call__"] is vars(torch.nn.Module)["_wrapped_call_impl"]
    assert "_call_impl" in torch.nn.Module._wrapped_call_impl.__code__.co_names
