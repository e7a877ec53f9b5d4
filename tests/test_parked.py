"""The tracker of a block that made a profile is parked, reset to as new, and the next block takes it
(``Tracker.made``/``Tracker.park``): nothing of the last block reaches the next one, and a tracker that something
else may still use is never taken again."""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.collect import tracker as tracker_module


def _step(model: nn.Module) -> None:
    model(torch.randn(2, 4)).sum().backward()


@pytest.fixture
def parked(monkeypatch: pytest.MonkeyPatch) -> list[tracker_module.Tracker]:
    """The parked trackers, none at first (other tests' blocks park theirs)."""
    trackers: list[tracker_module.Tracker] = []
    monkeypatch.setattr(tracker_module, "_PARKED", trackers)
    return trackers


def test_the_next_block_takes_the_parked_tracker_which_holds_nothing_of_the_last_one(
        parked: list[tracker_module.Tracker]) -> None:
    first, second = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with LayerProf(first) as prof:
        _step(first)
        tracker = prof._tracker
    assert parked == [tracker] and prof.tree.calls == 1
    assert (tracker.calls, tracker.names, tracker.wrapped_names, tracker.example, tracker.active) == ([], {}, {}, {},
                                                                                                       False)
    assert all(not (state.stack or state.bounds or state.owners or state.walked) for state in tracker._threads)
    with LayerProf(second) as again:
        assert again._tracker is tracker and parked == []
        _step(first)  # the last block's model, profiled no more: its calls are not this block's
        _step(second)
    assert list(again.records) == ["", "0", "1"]
    assert [again.records[name].calls for name in again.records] == [1, 1, 1]  # 3 modules, 1 call each
    assert again.tree.backward_ms > 0 and again.meta["environment"]["batch_size"] == 2
    assert prof.tree.calls == 1 and list(prof.records) == [""]  # the first profile is as it was
    assert parked == [tracker]


def test_a_block_that_raised_or_was_cancelled_parks_nothing(parked: list[tracker_module.Tracker]) -> None:
    model = nn.Linear(4, 4)
    with pytest.raises(ValueError):
        with LayerProf(model) as prof:
            _step(model)
            raise ValueError("inside")
    assert parked == [] and prof._tracker is None
    with LayerProf(model) as cancelled:
        _step(model)
        cancelled.cancel()
    assert parked == []


def test_only_a_block_with_the_default_clock_parks_and_takes(parked: list[tracker_module.Tracker]) -> None:
    model = nn.Linear(4, 4)
    with LayerProf(model, sync=True):  # a synced clock
        _step(model)
    assert parked == []
    with LayerProf(model):
        _step(model)
    tracker = parked[0]
    with LayerProf(model, sync=True) as synced:
        assert synced._tracker is not tracker
        _step(model)
    assert parked == [tracker]
    # A meter observing calls is told by the same call wrapper: its block takes the parked tracker, and parks it
    # again as new (no observer left on it)
    with LayerProf(model, metrics=("shapes",)) as other:
        assert other._tracker is tracker and parked == []
        _step(model)
    assert parked == [tracker] and tracker.observers == () and tracker.backward_observers == ()
    assert other.records[""].input_shapes is not None


def test_two_blocks_at_once_take_one_tracker_and_park_one(parked: list[tracker_module.Tracker]) -> None:
    outer_model, inner_model = nn.Linear(4, 4), nn.Linear(4, 4)
    with LayerProf(inner_model):
        _step(inner_model)
    tracker = parked[0]
    with LayerProf(outer_model) as outer:
        with LayerProf(inner_model) as inner:
            made = inner._tracker
            assert outer._tracker is tracker and made is not tracker
            _step(inner_model)
            _step(outer_model)
        assert parked == [made]
    assert outer.tree.calls == 1 and inner.tree.calls == 1
    assert parked == [made]  # one parked at most: the outer one, ending second, lets its own go


def test_a_tracker_whose_hooks_ran_on_two_threads_is_not_parked(parked: list[tracker_module.Tracker]) -> None:
    model = nn.Linear(4, 4)
    with LayerProf(model) as prof:
        worker = threading.Thread(target=lambda: model(torch.randn(2, 4)))
        worker.start()
        worker.join()
        _step(model)
    assert prof.tree.calls == 2 and parked == []
    # Its hooks ran on one thread, not the one that ends the block: not parked either (a hook of that thread past its
    # check of the block being on could append a call after the reset, which the next block would then count)
    with LayerProf(model) as prof:
        worker = threading.Thread(target=lambda: _step(model))
        worker.start()
        worker.join()
    assert prof.tree.calls == 1 and parked == []
    with LayerProf(model) as prof:  # on this thread: parked
        _step(model)
    assert prof.tree.calls == 1 and len(parked) == 1 and len(parked[0]._threads) == 1
    with LayerProf(model) as again:
        _step(model)
    assert again.tree.calls == 1 and again.tree.backward_ms > 0


def test_a_tracker_handed_to_a_root_step_is_not_parked(parked: list[tracker_module.Tracker]) -> None:
    # A RootStep may be kept past its block: a parked tracker taken by a later block would then count its calls.
    model = nn.Linear(4, 4)
    prof = LayerProf(model)
    prof.start()
    root = prof.root_step()
    _step(model)
    prof.stop()
    assert prof.tree.calls == 1 and parked == [] and root.tracker.lent
