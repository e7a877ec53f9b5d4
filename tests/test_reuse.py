"""A second block on an unchanged model reuses the first block's walk (collect/reuse.py); every change is seen."""
from __future__ import annotations

import collections
import copy
import threading
import time
import gc
import weakref
from typing import Any, Callable

import pytest
import torch
from torch import nn

import layerprof.collect.reuse as reuse
import layerprof
from anytree import PreOrderIter
from layerprof import LayerProf
from layerprof.record.records import ModuleRecord, build_tree, module_paths, tree_rows
from layerprof.metrics.params import PARAM_FIELDS

from .conftest import hook_state
from .measured import Sleeper


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8, bias=False)
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.ReLU()])
        self.blocks[0].register_buffer("scale", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b(self.a(x).to(self.b.weight.dtype)).float()
        for block in self.blocks:
            x = block(x.to(getattr(block, "weight", x).dtype)).float()
        for name, child in self._modules.items():
            if name not in ("a", "b", "blocks"):
                x = child(x.to(getattr(child, "weight", x).dtype)).float()
        return x


def _view(model: nn.Module) -> dict[str, tuple[Any, ...]]:
    """What a profile of one step shows per module: class, other names, calls, whether its backward was timed,
    and its parameter figures."""
    with LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
    return {
        name: (record.type, tuple(record.aliases), record.calls, record.backward_ms is not None,
               tuple(repr(getattr(record, field)) for field in PARAM_FIELDS))
        for name, record in prof.records.items()
    }


def test_an_unchanged_model_reuses_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Net()
    first = _view(model)
    plan = reuse._PLANS[model]
    walks: list[int] = []
    real = reuse.module_paths
    monkeypatch.setattr(reuse, "module_paths", lambda m: walks.append(1) or real(m))
    assert _view(model) == first and _view(model) == first
    assert walks == [] and reuse._PLANS[model] is plan
    # 7 modules: the root, a, b, blocks, blocks.0, blocks.1; each ran once with a backward (ReLU included).
    assert list(first) == ["", "a", "b", "blocks", "blocks.0", "blocks.1"]
    assert [calls for _, _, calls, _, _ in first.values()] == [1, 1, 1, 0, 1, 1]


def test_types_and_extra_reprs_are_read_at_every_exit_of_a_reused_plan() -> None:
    model = Net()

    def shown(prof: LayerProf) -> dict[str, tuple[str, str]]:
        return {name: (record.type, record.extra_repr) for name, record in prof.records.items()}

    def expected() -> dict[str, tuple[str, str]]:
        return {name: (type(module).__name__, module.extra_repr()) for name, module in model.named_modules()}

    with LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
    assert shown(prof) == expected() and shown(prof)["blocks"] == ("ModuleList", "")
    plan = reuse._PLANS[model]
    # Changed between blocks, and covered by no fingerprint: a hyperparameter, and an extra_repr set on a container's
    # instance; inside the block, a class (the plan's class names then no longer hold).
    model.blocks[1].inplace = True
    model.blocks.extra_repr = lambda: "two blocks"
    with LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
        model.blocks[1].__class__ = nn.ReLU6
    assert reuse._PLANS[model] is plan  # the block reused the plan
    assert shown(prof) == expected()
    assert shown(prof)["blocks"] == ("ModuleList", "two blocks") and shown(prof)["blocks.1"] == ("ReLU6", "inplace=True")


def _swap(m: Net) -> None:
    m.a, m.b = m.b, m.a


CHANGES: list[tuple[str, Callable[[Net], Any]]] = [
    ("module added by attribute", lambda m: setattr(m, "c", nn.Linear(8, 8))),
    ("module replaced by attribute", lambda m: setattr(m, "b", nn.Linear(8, 8))),
    ("module replaced in _modules directly", lambda m: m._modules.__setitem__("b", nn.Linear(8, 8))),
    ("module added in _modules directly", lambda m: m._modules.__setitem__("c", nn.Tanh())),
    ("module inserted in a ModuleList", lambda m: m.blocks.insert(1, nn.Tanh())),
    ("module deleted", lambda m: m.blocks.__delitem__(1)),
    ("submodules swapped by attribute", _swap),
    ("new parameter", lambda m: m.a.register_parameter("extra", nn.Parameter(torch.ones(3)))),
    ("parameter replaced by a tied one", lambda m: setattr(m.b, "weight", m.a.weight)),
    ("parameter replaced in _parameters directly",
     lambda m: m.a._parameters.__setitem__("bias", nn.Parameter(torch.zeros(8), requires_grad=False))),
    ("parameter set to None (the old one dies)", lambda m: setattr(m.a, "bias", None)),
    ("buffer replaced in _buffers directly", lambda m: m.blocks[0]._buffers.__setitem__("scale", torch.ones(2))),
    ("dtype changed", lambda m: m.b.double()),
    ("a buffer's data swapped for one of another size", lambda m: setattr(m.blocks[0].scale, "data", torch.ones(5))),
    ("requires_grad changed", lambda m: m.a.requires_grad_(False)),
    ("buffer added", lambda m: m.b.register_buffer("scale", torch.ones(5))),
    ("module shared under a second name", lambda m: m.add_module("again", m.blocks[1])),
]


@pytest.mark.parametrize("change", [c[1] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_every_change_is_seen(change: Callable[[Net], Any]) -> None:
    model = Net()
    before = _view(model)
    hooks = hook_state(model)
    assert _view(model) == before  # profiled twice: the second block reused the first one's plan
    change(model)
    after = _view(model)
    assert after != before
    assert after == _view(copy.deepcopy(model))  # exactly what a first profile of the changed model shows
    assert _view(model) == after  # and reused again once changed
    if hook_state(model).keys() == hooks.keys():
        assert hook_state(model) == hooks  # nothing left on the model


def test_a_shape_changed_under_the_same_count_keeps_the_plan() -> None:
    # The plan's figures are counts, bytes, dtypes and trainable flags: a transpose swapped in under the same
    # Parameter changes none of them, so the plan holds, and its profile is a first profile's.
    model = Net()
    _view(model)
    plan = reuse._PLANS[model]
    model.blocks[0].register_buffer("scale", torch.ones(6))  # 6 elements, to swap in a [2, 3] and a [3, 2]
    model.blocks[0].scale.data = torch.ones(2, 3)
    before = _view(model)
    plan = reuse._PLANS[model]
    model.blocks[0].scale.data = torch.ones(2, 3).t()
    assert _view(model) == before == _view(copy.deepcopy(model))
    assert reuse._PLANS[model] is plan


def test_plans_do_not_keep_the_model_alive_nor_cross_models() -> None:
    first, second = Net(), Net()
    _view(first)
    _view(second)
    assert reuse._PLANS[first] is not reuse._PLANS[second]
    # A profile of the second model times the second model's modules, not the first's (same structure).
    with LayerProf(second) as prof:
        second(torch.randn(2, 8)).sum().backward()
    assert prof.tree.calls == 1
    with LayerProf(first) as prof:
        pass_through = prof
    assert pass_through.records["a"].calls == 0
    alive = weakref.ref(first)
    module = weakref.ref(first.a)
    gc.collect()  # models of earlier tests that only cyclic garbage still held: not this test's to count
    plans = len(reuse._PLANS)
    del first, prof, pass_through
    gc.collect()
    assert alive() is None and module() is None
    assert len(reuse._PLANS) == plans - 1


def test_a_module_that_died_is_a_change() -> None:
    # Its address may be reused by a new module: the plan holds modules by weak reference and sees the old one die.
    model = Net()
    _view(model)
    del model.b
    gc.collect()
    model.b = nn.Linear(8, 8, bias=False)
    assert _view(model) == _view(copy.deepcopy(model))


def test_a_compiled_or_scripted_child_is_refused_after_a_reused_block() -> None:
    model = Net()
    _view(model)
    model.b = torch.jit.script(nn.Linear(8, 8))
    with pytest.raises(TypeError, match="module 'b'.*TorchScript"):
        with LayerProf(model):
            pass


class Grows(nn.Module):
    """Registers a head on its third call: after an earlier block planned the model without it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        if self.seen == 3:
            self.head = nn.Linear(8, 2)
        x = self.body(x)
        return self.head(x) if hasattr(self, "head") else x


def test_a_reused_plan_names_modules_as_a_walk_does_and_a_joined_module_is_hooked_again() -> None:
    model = Grows()
    with LayerProf(model):
        model(torch.randn(2, 8)).sum().backward()  # call 1: the plan, without the head
    plan = reuse._PLANS[model]
    with LayerProf(model, schedule=layerprof.schedule(wait=1, active=1)) as prof:
        assert reuse._PLANS[model] is plan
        # Steps 0-3 (calls 2-5): wait, active (the head joins and is hooked at once), wait, active (hooked again).
        for step in range(4):
            if step == 1:  # hooked from the plan's names: what a walk of the model gives
                assert prof._tracker.names == {id(m._forward_pre_hooks): name for name, m in model.named_modules()}
            model(torch.randn(2, 8)).sum().backward()
            prof.step()
    head = prof.records["head"]
    assert (head.steps, head.steps_run, head.calls) == (2, 2, 1)  # both active steps, one call each
    assert prof.records["body"].steps_run == 2 and head.backward_ms is not None


def test_a_module_that_joins_a_reused_block_is_held_by_it_and_the_plan_keeps_its_names() -> None:
    # A block shares its plan's names until a module joins, then copies them: the joined module is the block's
    # (another profiler on it is refused), and the plan names only the modules it was made from.
    model = Grows()
    with LayerProf(model):
        model(torch.randn(2, 8))  # call 1: the plan, without the head
    plan = reuse._PLANS[model]
    names, first_names = dict(plan.names), list(plan._first_names)
    with LayerProf(model) as prof:
        assert prof._names is plan.names and prof._entries.names is plan._first_names  # shared, no pair made
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))  # call 3: the head joins
        assert prof._names is not plan.names and prof._names[id(model.head)] == "head"
        assert list(prof._entries) == [("", model), ("body", model.body), ("head", model.head)]
        assert prof._entries[2] == ("head", model.head) and len(prof._entries) == 3
        assert LayerProf.running_on(model.head) is prof
        with pytest.raises(RuntimeError, match=r"the model \(Linear\) is already being profiled"):
            LayerProf(model.head).start()
    assert plan.names == names and id(model.head) not in plan.names and plan._first_names == first_names
    assert LayerProf.running_on(model) is None and not layerprof.collect.profiler._PROFILED


def test_a_plan_builds_the_tree_that_build_tree_builds() -> None:
    model = Net()
    model.add_module("again", model.blocks[1])  # a module under two names: one record, with an alias
    paths = module_paths(model)
    root, records = reuse.Plan(paths).records()
    built, by_name, _ = build_tree(model, reprs=False, paths=paths)

    def shape(tree: ModuleRecord) -> list[tuple[Any, ...]]:
        return [(r.name, r.parent and r.parent.name, [c.name for c in r.children], r.depth, r.aliases)
                for r in PreOrderIter(tree)]

    assert list(records) == list(by_name) == ["", "a", "b", "blocks", "blocks.0", "blocks.1"]
    assert shape(root) == shape(built) and tree_rows(root) == tree_rows(built)
    assert records["blocks.1"].aliases == ["again"] and records["a"].aliases is not records["b"].aliases
    # A tree anytree's own checks accept: a record moves as any node does.
    records["a"].parent = records["blocks"]
    assert [c.name for c in root.children] == ["b", "blocks"]
    assert [c.name for c in records["blocks"].children] == ["blocks.0", "blocks.1", "a"]


def _long() -> nn.Sequential:
    # 1 + 600 * 3 = 1,801 modules: four fingerprint pieces of 512 (reuse._PIECE), the last of 265.
    return nn.Sequential(*[nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(600)])


LATE_CHANGES: list[tuple[str, Callable[[nn.Sequential], Any]]] = [
    ("a module replaced", lambda m: setattr(m[599], "0", nn.Linear(2, 2))),
    ("a child put in _modules directly", lambda m: m[599]._modules.__setitem__("1", nn.Tanh())),
    ("requires_grad", lambda m: m[599][0].weight.requires_grad_(False)),
    ("a dtype", lambda m: setattr(m[599][0].bias, "data", m[599][0].bias.data.double())),
    ("a buffer added", lambda m: m[599][1].register_buffer("extra", torch.zeros(1))),
]


@pytest.mark.parametrize("change", [c[1] for c in LATE_CHANGES], ids=[c[0] for c in LATE_CHANGES])
def test_a_change_in_the_last_piece_of_a_long_model_is_seen(change: Callable[[nn.Sequential], Any]) -> None:
    model = _long()
    assert reuse._PIECE == 512
    with LayerProf(model):
        pass
    plan = reuse._PLANS[model]
    assert plan.key is not None and len(plan.key) == 4  # ceil(1,801 / 512)
    with LayerProf(model):
        pass
    assert reuse._PLANS[model] is plan  # unchanged: reused
    change(model)
    with LayerProf(model) as prof:
        pass
    assert reuse._PLANS[model] is not plan
    assert len(prof.records) == 1801
    assert prof.records["599.1"].type == type(model[599][1]).__name__


@pytest.mark.parametrize("where", ["a", ""])
def test_a_pre_hook_added_after_a_reused_block_stays_outside_its_module(where: str) -> None:
    # The plan's key counts each module's pre-hooks: one added since makes a new plan; at each call of the module
    # layerprof's pre-hook goes after the user's, as on a model profiled for the first time.
    model = Net()
    _view(model)
    _view(model)
    plan = reuse._PLANS[model]
    hook = Sleeper(0.03)
    model.get_submodule(where).register_forward_pre_hook(hook)

    def profile_and_check() -> None:
        start = time.perf_counter_ns()
        with LayerProf(model) as prof:
            out = model(torch.randn(2, 8))
            wall_ms = (time.perf_counter_ns() - start) / 1e6
            out.sum().backward()
        # The hook's sleep is outside the module's time and inside what holds it: the parent's forward for "a", the
        # wall time of the call for the model itself (measured: no bound on the module's own time, which a
        # preemption could reach).
        assert prof.records[where].forward_ms + hook.slept_ms[-1] <= (prof.tree.forward_ms if where else wall_ms)

    profile_and_check()
    assert reuse._PLANS[model] is not plan
    profile_and_check()  # the new plan, reused: the hook stays outside


@pytest.mark.parametrize("blocks_before", [1, 2])
@pytest.mark.parametrize("parent", ["", "a", "blocks"])
def test_a_module_put_in_modules_directly_inside_a_reused_block_is_named(parent: str, blocks_before: int) -> None:
    # The block's exit reads every module's children in order against the plan's: one more anywhere is seen, a
    # leaf's (a Linear's) included. After two blocks, the exit first compares the versions of the modules' dicts
    # with those the last block's end read (``reuse.written``): the write is a new version.
    model = Net()
    for _ in range(blocks_before):
        _view(model)
    plan = reuse._PLANS[model]
    assert (plan.checked is not None) == (blocks_before == 2 and reuse.dict_version is not None)
    name = f"{parent}.sneaky" if parent else "sneaky"
    with pytest.warns(RuntimeWarning, match=rf"1 module\(s\) joined .* '{name}' \(Tanh\)"):
        with LayerProf(model):
            assert reuse._PLANS[model] is plan
            model(torch.randn(2, 8)).sum().backward()
            model.get_submodule(parent)._modules["sneaky"] = nn.Tanh()


def test_a_module_put_in_the_last_piece_of_a_long_model_inside_a_reused_block_is_named() -> None:
    # The exit reads the children in pieces of 512 modules (reuse._PIECE), as the fingerprint: the last of four.
    model = _long()
    with LayerProf(model):
        pass
    plan = reuse._PLANS[model]
    with pytest.warns(RuntimeWarning, match=r"1 module\(s\) joined .* '599\.1\.sneaky' \(Tanh\)"):
        with LayerProf(model):
            assert reuse._PLANS[model] is plan
            model[599][1]._modules["sneaky"] = nn.Tanh()


WRITES: list[tuple[str, Callable[[dict[Any, Any]], Any]]] = [
    ("set", lambda d: d.__setitem__("a", object())),
    ("set to another value", lambda d: d.__setitem__("b", 2)),
    ("deleted", lambda d: d.__delitem__("b")),
    ("popped", lambda d: d.pop("b")),
    ("set by setdefault", lambda d: d.setdefault("c", 3)),
    ("updated", lambda d: d.update(c=3)),
    ("cleared", lambda d: d.clear()),
    ("an item popped", lambda d: d.popitem()),
]


@pytest.mark.skipif(reuse.dict_version is None, reason="this torch reads no dict versions")
@pytest.mark.parametrize("kind", [dict, collections.OrderedDict])
@pytest.mark.parametrize("write", [w[1] for w in WRITES], ids=[w[0] for w in WRITES])
def test_every_write_into_a_table_is_a_new_version(kind: type, write: Callable[[dict[Any, Any]], Any]) -> None:
    # What the fast check of a reused plan relies on: a table (a dict, or the OrderedDict of hooks) that reads the
    # version it read before holds what it held; another dict never reads the same version.
    table = kind(b=1)
    before = reuse.dict_version(table)
    assert reuse.dict_version(table) == before
    write(table)
    assert reuse.dict_version(table) != before
    assert reuse.dict_version(kind(b=1)) not in (before, reuse.dict_version(table))


@pytest.mark.skipif(reuse.dict_version is None, reason="this torch reads no dict versions")
@pytest.mark.parametrize("kind", [dict, collections.OrderedDict])
def test_an_empty_table_filled_by_update_is_a_new_version(kind: type) -> None:
    # CPython copies a dict whole into an empty one (an event a dict watcher may leave out): a buffer table filled
    # so must not read as it was.
    table = kind()
    before = reuse.dict_version(table)
    table.update({"scale": torch.ones(2)})
    assert reuse.dict_version(table) != before


def test_the_fast_check_of_a_reused_plan_reads_no_table_and_gives_what_a_full_one_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # From the second block on, the tables' versions stand for their contents (the tensors are read), and the
    # versions of the dicts a block's end reads for its checks: profiles are those of a model without versions.
    model = Net()
    first = _view(model)
    assert _view(model) == first
    plan = reuse._PLANS[model]
    if reuse.dict_version is not None:
        assert plan.checked is not None
        read: list[int] = []
        real_piece = reuse._piece
        monkeypatch.setattr(reuse, "_piece", lambda *a: read.append(1) or real_piece(*a))
        assert _view(model) == first and read == []  # no table read for the key, nor its contents
        monkeypatch.undo()
    monkeypatch.setattr(reuse, "dict_version", None)
    again = Net()
    again.load_state_dict(model.state_dict())
    assert _view(again) == _view(again) == _view(again) == first
    assert reuse._PLANS[again].checked is None


def test_a_model_of_more_modules_than_versions_are_read_for_reads_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past reuse._VERSIONED modules the key's own passes cost less than a version per table: never read there.
    model = _long()
    read: list[int] = []
    real = reuse.dict_version
    monkeypatch.setattr(reuse, "dict_version", None if real is None else (lambda d: read.append(1) or real(d)))
    for _ in range(3):
        with LayerProf(model):
            pass
    plan = reuse._PLANS[model]
    assert len(plan.types) > reuse._VERSIONED and read == [] and plan.checked is None


def test_a_block_that_raised_leaves_the_next_block_on_the_plan_true() -> None:
    # A block whose step raised makes no profile, and its end checks nothing: what the step changed before raising
    # is seen by the next block.
    model = Net()
    first = _view(model)
    _view(model)
    with pytest.raises(ValueError, match="inside"):
        with LayerProf(model):
            model(torch.randn(2, 8)).sum().backward()
            model.blocks[1].inplace = True
            model.a.bias = None
            raise ValueError("inside")
    after = _view(model)
    assert after == _view(copy.deepcopy(model)) and after != first
    assert after["blocks.1"][0] == "ReLU" and after["a"][4] != first["a"][4]  # the params without a bias


def test_a_block_on_another_thread_after_reused_ones_gives_the_same_profile() -> None:
    model = Net()
    first = _view(model)
    _view(model)
    seen: list[dict[str, tuple[Any, ...]]] = []
    thread = threading.Thread(target=lambda: seen.append(_view(model)))
    thread.start()
    thread.join()
    assert seen == [first] and _view(model) == first


def test_a_pre_hook_added_during_a_wait_step_of_a_reused_block_stays_outside_its_module() -> None:
    # The plan's modules with pre-hooks hold for the block's first attach only: with a schedule that waits, the
    # first attach comes after user code has run, and reads the modules' hook dicts again.
    model = Net()
    _view(model)
    plan = reuse._PLANS[model]
    with LayerProf(model, schedule=layerprof.schedule(wait=1, active=1)) as prof:
        assert reuse._PLANS[model] is plan
        model(torch.randn(2, 8)).sum().backward()
        model.a.register_forward_pre_hook(hook := Sleeper(0.03))  # in the wait step: nothing hooked yet
        prof.step()
        model(torch.randn(2, 8)).sum().backward()
        prof.step()
    # The 30 ms hook: outside "a", inside the model (measured, tests/measured.py).
    assert prof.records["a"].calls == 1 and prof.records["a"].forward_ms + hook.slept_ms[-1] <= prof.tree.forward_ms
    assert prof.tree.forward_ms >= 30


def _environment(model: nn.Module, inside: Callable[[], Any] = lambda: None) -> dict[str, Any]:
    with LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
        inside()
    return prof.meta["environment"]


class Bare(nn.Module):
    """No parameter of its own, its first child none either: the first parameter is the second child's."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()
        self.last = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.act(x).to(self.last.weight.dtype)).float()


def test_the_environment_of_a_reused_plan_is_its_first_parameters_even_when_it_changes_inside_the_block() -> None:
    # A reused plan's end with nothing written into the model reads the device and dtype from the first parameter
    # the plan kept (no walk); a parameter replaced inside the block is a write: read from the model again.
    model = Bare()
    assert [_environment(model)["dtype"] for _ in range(3)] == ["float32"] * 3
    assert reuse._PLANS[model].first_parameter() is model.last.weight  # (the ReLU holds none)
    model.last.half()  # the same Parameter, its data swapped: read from it at the end
    assert _environment(model)["dtype"] == "float16"
    model.last.float()
    _environment(model)

    kept = model.last.weight  # (alive: the plan's first parameter, which a block that read it would read)

    def swap() -> None:
        model.last.weight = nn.Parameter(kept.detach().double())
        model.last.bias = nn.Parameter(model.last.bias.detach().double())

    assert _environment(model, swap)["dtype"] == "float64"
    assert reuse._PLANS[model].first_parameter() is kept  # (the plan's, its start's: not read at this end)
    assert _environment(model)["dtype"] == "float64"  # (a new plan)


def test_the_environment_of_a_model_without_parameters_has_no_dtype() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Tanh())
    for _ in range(3):
        with LayerProf(model) as prof:
            model(torch.randn(2, 8, requires_grad=True)).sum().backward()
        assert prof.meta["environment"]["dtype"] is None and prof.meta["environment"]["device"] is None
    assert reuse._PLANS[model].first_parameter() is None
