from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import layerprof.collect.profiler as profiler_module
from layerprof import LayerProf

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread():
    """Each test starts single-threaded, as this file sets torch: a test that runs the command in-process with
    ``--threads 2`` (or sets threads itself and fails before putting them back) left the next test of its worker
    at 2 threads, and a roofline test that reads the threads failed in that order only."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--regenerate-golden", action="store_true", default=False,
                     help="rewrite tests/golden/ from the current rendering (review the diff before committing)")


# Torch's own Module._call_impl and its code, as they are before any profile: a block routes module calls through
# its call wrapper, put inside that function (its code swapped) or in its place in nn.Module.
TORCH_CALL_IMPL = vars(torch.nn.Module)["_call_impl"]
TORCH_CALL_CODE = TORCH_CALL_IMPL.__code__


def module_call() -> Any:
    """What a module call runs now: nn.Module's ``_call_impl``, or, where a block swapped its code, the function
    that code calls (the block's call wrapper, given as a keyword default)."""
    func = vars(torch.nn.Module)["_call_impl"]
    if func is TORCH_CALL_IMPL and func.__code__ is not TORCH_CALL_CODE:
        return func.__kwdefaults__["_layerprof_call"]
    return func


def hook_state(model: torch.nn.Module, calls: bool = True) -> dict[str | None, tuple]:
    """Every hook dict of every module, to check that profiling leaves the model as it found it, and (``calls``)
    what ``nn.Module`` runs for a call and what starts a backward pass, under the key None: torch's own
    ``_call_impl`` and ``torch.autograd._engine_run_backward`` once every block is over."""
    state: dict[str | None, tuple] = {None: (module_call(), TORCH_CALL_IMPL.__code__, TORCH_CALL_IMPL.__kwdefaults__,
                                             torch.autograd._engine_run_backward)} if calls else {}
    for name, module in model.named_modules():
        state[name] = tuple(
            tuple(getattr(module, attr).keys())
            for attr in (
                "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
                "_state_dict_hooks", "_load_state_dict_pre_hooks",
            )
        ) + (tuple(sorted(module.__dict__)),)
    return state


def profile_quietly(model: torch.nn.Module, step: Callable[[], object], steps: int,
                    metrics: tuple[str, ...] = ("memory",)) -> LayerProf:
    """``steps`` calls of ``step``, each closed with ``prof.step()``, in a block with ``metrics``, its warnings (one
    step slowed by a meter, ...) silenced: the planner's tests read the figures, not the advice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=metrics) as prof:
            for _ in range(steps):
                step()
                prof.step()
    return prof


@pytest.fixture(autouse=True)
def no_torchscript_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profile as in a process that never scripted or traced anything, a user's usual one: this one has (test
    modules script functions as they are imported), which turns on the hooks a profile puts on the start nodes of
    the walks it puts off (``Tracker.early_hooks``). A test that wants them patches ``torchscript_compiled`` back."""
    monkeypatch.setattr(profiler_module, "torchscript_compiled", lambda: False)


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's mark, used by the docs tests (one group per page), known where xdist is not installed.
    config.addinivalue_line("markers", "xdist_group(name): run under --dist loadgroup on one pytest-xdist worker")


# On a torch older than the live-bytes reader needs, LayerProf refuses metrics=("live_memory",) as it is made
# (layerprof._version.check_live_bytes_torch). A test that fails only for that refusal, in its process or in one it
# runs, is reported as skipped, with the reason: the feature is refused there, by design. Nothing changes on a
# newer torch.
_LIVE_REFUSAL = "metrics=('live_memory',) needs torch"


def _live_bytes_refused() -> bool:
    from layerprof._version import LIVE_BYTES_TORCH, _short_of

    return _short_of(torch.__version__, LIVE_BYTES_TORCH) is not None


@pytest.fixture
def live_bytes_torch() -> None:
    """Skip on a torch whose storages' weak references see no frees (what the live-bytes reader relies on): a test
    that reads live bytes or storage liveness itself, without the refused meter."""
    if _live_bytes_refused():
        from layerprof._version import LIVE_BYTES_TORCH

        pytest.skip(f"a storage's weak reference sees its storage freed from torch {LIVE_BYTES_TORCH}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    said = str(report.longrepr) + "".join(content for _, content in report.sections)  # (captured output too)
    if report.failed and call.when in ("setup", "call") and _LIVE_REFUSAL in said and _live_bytes_refused():
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: the live_memory meter is refused on torch {torch.__version__} (needs "
                           "layerprof._version.LIVE_BYTES_TORCH)")
    return None
