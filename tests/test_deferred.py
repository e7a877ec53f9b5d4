"""A block whose records nothing read while it ran makes them when its profile is first read (collect/profiler.py,
``Profile.deferred``): what they show is the model as it was when the block ended, whatever changes after; the
unread profile holds no module; errors and warnings still come when the block ends."""
from __future__ import annotations

import gc
import pickle
import weakref

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .models import LAYER_NORM_BIAS


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.norm = nn.LayerNorm(4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.linear(x)))


def _step(model: nn.Module) -> None:
    model(torch.randn(2, 8)).sum().backward()


def _profiled(model: nn.Module) -> LayerProf:
    with LayerProf(model) as prof:
        _step(model)
    return prof


@pytest.mark.parametrize("blocks", [1, 2])  # a new model, and one whose plan the block reuses
def test_records_are_made_when_first_read(blocks: int) -> None:
    model = Net()
    for _ in range(blocks):
        prof = _profiled(model)
    assert prof.profile._build is not None  # nothing made yet
    assert list(prof.records) == ["", "linear", "norm", "act"]
    assert prof.profile._build is None
    linear = prof.records["linear"]
    # Linear(8, 4): 8 * 4 weights + 4 biases = 36; one call, timed both ways.
    assert (linear.params, linear.calls, linear.steps) == (36, 1, 1)
    assert linear.forward_ms > 0 and linear.backward_ms > 0
    assert linear.extra_repr == "in_features=8, out_features=4, bias=True"
    assert prof.tree is prof.records[""] and prof.tree.children[0] is linear


def test_a_change_after_the_block_is_not_in_its_profile() -> None:
    model = Net()
    _profiled(model)
    prof = _profiled(model)
    model.linear = nn.Linear(8, 4, bias=False)  # replaced, then changed in place, before the profile is read
    model.norm.eps = 0.5
    model.act = nn.GELU()
    model.half()
    linear, norm, act = (prof.records[name] for name in ("linear", "norm", "act"))
    assert linear.extra_repr == "in_features=8, out_features=4, bias=True" and linear.params == 36
    assert linear.param_dtypes == {"float32": 36}
    assert norm.extra_repr == f"(4,), eps=1e-05, elementwise_affine=True{LAYER_NORM_BIAS}"
    assert (act.type, act.extra_repr) == ("ReLU", "")


def test_an_unread_profile_holds_no_module() -> None:
    model = Net()
    _profiled(model)
    profile = _profiled(model).profile  # the LayerProf holds its model; its profile does not
    alive, linear = weakref.ref(model), weakref.ref(model.linear)
    del model
    gc.collect()
    assert alive() is None and linear() is None
    assert profile.records["linear"].calls == 1 and profile.records["linear"].params == 36  # still readable


def test_a_meter_that_reads_records_makes_them_while_the_block_runs() -> None:
    model = Net()
    with LayerProf(model, metrics=("params", "shapes")) as prof:
        _step(model)
    assert prof.profile._build is None  # made and filled as the block ended
    assert prof.records["linear"].params == 36 and prof.records["linear"].calls == 1


def test_records_read_inside_the_block_are_the_profiles() -> None:
    model = Net()
    _profiled(model)
    with LayerProf(model) as prof:
        inside = prof.records
        _step(model)
    assert prof.records is not inside  # the profile's own dict, of the same records
    assert list(prof.records.values()) == list(inside.values())
    assert inside["linear"].calls == 1


def test_the_no_step_warning_comes_when_the_block_ends() -> None:
    model = Net()
    _profiled(model)
    with pytest.warns(RuntimeWarning, match="recorded no step"):
        with LayerProf(model) as prof:
            pass
    assert prof.profile._build is not None
    assert prof.records["linear"].calls == 0


def test_an_unread_profile_pickles_with_its_records() -> None:
    # What a deferred profile makes its records from holds the model's modules weakly, which do not pickle: it
    # makes them first, so pickle.loads gives the same records.
    import pickle

    model = Net()
    _profiled(model)
    prof = _profiled(model)
    assert prof.profile._build is not None
    loaded = pickle.loads(pickle.dumps(prof.profile))
    assert list(loaded.records) == ["", "linear", "norm", "act"]
    assert loaded.records["linear"].params == 36 and loaded.records["linear"].forward_ms > 0


def test_two_unread_profiles_across_a_change_keep_their_own_structure() -> None:
    model = Net()
    _profiled(model)
    before = _profiled(model)  # unread while the model changes and is profiled again
    model.act = nn.Sequential(nn.GELU(), nn.Dropout(0.0))
    after = _profiled(model)
    assert list(after.records) == ["", "linear", "norm", "act", "act.0", "act.1"]
    assert list(before.records) == ["", "linear", "norm", "act"]
    assert (before.records["act"].type, after.records["act"].type) == ("ReLU", "Sequential")


def test_two_threads_reading_an_unread_profile_at_once_get_one_set_of_records() -> None:
    # The build releases the GIL (a large model's takes tens of ms): a second reader that came in meanwhile must
    # wait for it, not make a second tree, else one thread holds a tree and records the profile no longer has.
    import threading
    import time

    from layerprof.profile import Profile
    from layerprof.record.records import ModuleRecord

    made: list[ModuleRecord] = []

    def build() -> tuple[ModuleRecord, dict[str, ModuleRecord]]:
        time.sleep(0.05)
        made.append(ModuleRecord("", "Net"))
        return made[-1], {"": made[-1]}

    profile = Profile.deferred({}, build)
    seen: list[tuple[ModuleRecord, dict[str, ModuleRecord]]] = []
    readers = [threading.Thread(target=lambda: seen.append((profile.tree, profile.records))) for _ in range(2)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert len(made) == 1  # built once, by the first reader; the second waited for it
    assert [tree for tree, _ in seen] == [made[0], made[0]]
    assert [records[""] for _, records in seen] == [made[0], made[0]] and seen[0][1] is seen[1][1]


def test_a_profile_pickled_before_deferral_still_loads() -> None:
    # Before records were made on first read, a Profile's pickle held them as ``tree`` and ``records``.
    import pickle

    prof = _profiled(Net())
    state = prof.profile.__getstate__()
    old = {("tree" if key == "_tree" else "records" if key == "_records" else key): value
           for key, value in state.items()}
    restored = object.__new__(type(prof.profile))
    restored.__setstate__(pickle.loads(pickle.dumps(old)))
    assert list(restored.records) == ["", "linear", "norm", "act"]
    assert restored.tree is restored.records[""] and restored.records["linear"].params == 36


@pytest.mark.parametrize("blocks", [1, 2])  # a new model, and one whose plan the block reuses
def test_the_steps_times_are_made_when_first_read(blocks: int) -> None:
    # The block's only step: its calls are kept as they were stamped, and turned into times (the records', the
    # meta's per-step totals) when the profile or its meta is first read.
    model = Net()
    for _ in range(blocks):
        prof = _profiled(model)
    profile = prof.profile
    assert prof._stats._later is not None and profile._meta_later is not None
    meta = profile.meta
    assert profile._meta_later is None and prof._stats._later is None
    root = profile.records[""]
    assert list(meta)[-1] == "step_ms" and meta["steps"] == 1  # where the block wrote it before
    assert meta["step_ms"] == {"forward": [round(root.forward_ms, 6)], "backward": [round(root.backward_ms, 6)]}
    copied = pickle.loads(pickle.dumps(_profiled(model).profile))
    assert copied.meta["step_ms"]["forward"][0] > 0 and copied._meta_later is None


def test_a_step_in_which_a_module_raised_is_timed_as_the_block_ends() -> None:
    # A call that raised may hold what its walk was to hook (graph nodes) or the exception being handled: the
    # profile does not keep such calls, its times are made at once.
    model = Net()
    _profiled(model)
    with LayerProf(model) as prof:
        with pytest.raises(RuntimeError):
            model.linear(torch.randn(2, 3))  # 3 features where 8 are expected
        _step(model)
    assert prof._stats._later is None
    assert prof.records["linear"].calls == 1 and prof.records[""].calls == 1  # the call that raised is none


def test_the_tracker_counts_the_calls_that_returned_and_starts_each_step_and_block_from_none() -> None:
    # A block's end tells that every call returned from the tracker's count of returns (no pass over the calls):
    # 4 calls (the root, linear, norm, act) returned 4 times; a call that raised is not counted; the count
    # starts again with each step, and with each block on a parked tracker.
    model = Net()
    for _ in range(3):
        with LayerProf(model) as prof:
            tracker = prof._tracker
            assert tracker is not None and tracker.returned == 0
            _step(model)
            assert tracker.returned == len(tracker.calls) == 4 and tracker.counted_all_returned()
            prof.step()
            assert tracker.returned == len(tracker.calls) == 0
            with pytest.raises(RuntimeError):
                model.linear(torch.randn(2, 3))  # 3 features where 8 are expected: 1 call, none returned
            _step(model)
            assert (tracker.returned, len(tracker.calls)) == (4, 5) and not tracker.counted_all_returned()
    assert prof.records["linear"].calls == 1 and prof.records[""].calls == 1  # (means of two steps: 1 each)
