from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--regenerate-golden", action="store_true", default=False,
                     help="rewrite tests/golden/ from the current rendering (review the diff before committing)")


def hook_state(model: torch.nn.Module) -> dict[str, tuple]:
    """Every hook dict of every module, to check that profiling leaves the model as it found it."""
    state = {}
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


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's mark, used by the docs tests (one group per page), known where xdist is not installed.
    config.addinivalue_line("markers", "xdist_group(name): run under --dist loadgroup on one pytest-xdist worker")
