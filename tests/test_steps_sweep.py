"""Profiles of many steps: warm-up, schedules and what the profile says of the steps it recorded."""
from __future__ import annotations

import torch
from torch import nn

import layerprof
from layerprof import LayerProf


def _run(prof: LayerProf, net: nn.Module, batches: list[int]) -> None:
    prof.start()
    for batch in batches:
        net(torch.randn(batch, 4)).sum().backward()
        prof.step()
    prof.stop()


def test_warmup_steps_batch_size_is_not_the_profiles() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    batches = [64] * 5 + [8] * 3  # the warm-up steps ran another batch size than the 3 recorded ones
    for prof in (LayerProf(net, warmup=5),
                 LayerProf(net, schedule=layerprof.schedule(warmup=5, active=3, repeat=1))):
        _run(prof, net, batches)
        assert prof.records[""].steps == 3
        environment = prof.profile.meta["environment"]
        assert environment["batch_size"] == 8
        assert "batch_sizes" not in environment


def test_a_step_dropped_by_stop_partial_sets_no_batch_size() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    prof = LayerProf(net).start()
    for _ in range(2):
        net(torch.randn(8, 4)).sum().backward()
        prof.step()
    for _ in range(3):  # the failing step's calls, dropped with it
        net(torch.randn(64, 4))
    prof.stop(partial="the data loader failed")
    assert prof.records[""].steps == 2
    environment = prof.profile.meta["environment"]
    assert environment["batch_size"] == 8
    assert "batch_sizes" not in environment
