"""A block on a model profiled before reuses the last block's extra_repr text of torch.nn's costlier layers while
nothing it was made from changed (collect/reprs.py); every change that the model's own repr shows is seen."""
from __future__ import annotations

import ast
import inspect
import string
import textwrap
from typing import Any, Callable

import pytest
import torch
from torch import nn

import layerprof.collect.reprs as reprs
import layerprof.collect.reuse as reuse
from layerprof import LayerProf

from .models import LAYER_NORM_BIAS


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.dropout = nn.Dropout(0.5)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dropout(self.norm(self.linear(x))))


def _reprs(model: nn.Module, inside: Callable[[nn.Module], Any] = lambda m: None) -> dict[str, str]:
    with LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
        inside(model)
    return {name: record.extra_repr for name, record in prof.records.items()}


def _expected(model: nn.Module) -> dict[str, str]:
    return {name: module.extra_repr() for name, module in model.named_modules()}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Calls of Linear's and LayerNorm's extra_repr, by class name (kept as torch's own: the spies are the kept
    functions, reading what torch's do)."""
    calls: list[str] = []
    for cls in (nn.Linear, nn.LayerNorm):
        real = cls.extra_repr

        def spy(self: nn.Module, real: Callable[[nn.Module], str] = real) -> str:
            calls.append(type(self).__name__)
            return real(self)

        monkeypatch.setattr(cls, "extra_repr", spy)
        monkeypatch.setitem(reprs._KEPT, cls, spy)
        monkeypatch.setitem(reprs._READS, spy, reprs._READS[real])
    return calls


def test_an_unchanged_model_reuses_the_texts(counted: list[str]) -> None:
    model = Net()
    first = _reprs(model)
    # The first block calls each once (Dropout's and ReLU's are kept too, not counted here).
    assert sorted(counted) == ["LayerNorm", "Linear"]
    assert first == _expected(model) and first["dropout"] == "p=0.5, inplace=False"
    plan = reuse._PLANS[model]
    assert sorted(kind.__name__ for kind in plan.reprs) == ["Dropout", "LayerNorm", "Linear", "ReLU"]
    kept = dict(plan.reprs)
    counted.clear()
    assert _reprs(model) == first and _reprs(model) == first
    assert counted == [] and reuse._PLANS[model] is plan
    assert plan.reprs == kept  # each class's texts: the same objects, nothing read again per module
    if reuse.dict_version is not None:  # from the third block on, not even the values they were made from
        groups: list[Any] = []
        real = reprs._read_group
        reprs._read_group = lambda *a: groups.append(a) or real(*a)  # type: ignore[assignment]
        try:
            assert _reprs(model) == first and groups == []
        finally:
            reprs._read_group = real


def _set_bias_none(model: Net) -> None:
    model.linear.bias = None


CHANGES: list[tuple[str, Callable[[Net], Any], str, str]] = [
    # (change, module, the text after)
    ("dropout probability", lambda m: setattr(m.dropout, "p", 0.3), "dropout", "p=0.3, inplace=False"),
    ("in_features edited", lambda m: setattr(m.linear, "in_features", 9), "linear",
     "in_features=9, out_features=8, bias=True"),
    ("eps", lambda m: setattr(m.norm, "eps", 1e-3), "norm",
     f"(8,), eps=0.001, elementwise_affine=True{LAYER_NORM_BIAS}"),
    ("the same value as another object", lambda m: setattr(m.norm, "eps", float("1e-05")), "norm",
     f"(8,), eps=1e-05, elementwise_affine=True{LAYER_NORM_BIAS}"),
    ("a tuple replaced by an equal one", lambda m: setattr(m.norm, "normalized_shape", tuple([8])), "norm",
     f"(8,), eps=1e-05, elementwise_affine=True{LAYER_NORM_BIAS}"),
    ("an int where a bool was", lambda m: setattr(m.act, "inplace", 1), "act", "inplace=True"),
    ("a bool where an int was", lambda m: setattr(m.linear, "out_features", True), "linear",
     "in_features=8, out_features=True, bias=True"),
    ("an attribute deleted and set again", lambda m: (delattr(m.linear, "in_features"),
                                                     setattr(m.linear, "in_features", 7)), "linear",
     "in_features=7, out_features=8, bias=True"),
    ("the bias set to None", _set_bias_none, "linear", "in_features=8, out_features=8, bias=False"),
    ("train mode", lambda m: m.eval(), "dropout", "p=0.5, inplace=False"),
    ("extra_repr set on the instance", lambda m: setattr(m.linear, "extra_repr", lambda: "mine"), "linear", "mine"),
    ("class changed", lambda m: (setattr(m.act, "approximate", "tanh"), setattr(m.act, "__class__", nn.GELU)), "act",
     "approximate='tanh'"),
]


@pytest.mark.parametrize("change,module,text", [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_every_change_between_blocks_is_seen(change: Callable[[Net], Any], module: str, text: str) -> None:
    model = Net()
    _reprs(model)
    _reprs(model)
    change(model)
    after = _reprs(model)
    assert after == _expected(model) and after[module] == text


@pytest.mark.parametrize("change,module,text", [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_every_change_inside_a_block_after_reused_ones_is_seen(change: Callable[[Net], Any], module: str,
                                                               text: str) -> None:
    # From the second block on, a block's end compares the versions of the modules' dicts with the last end's
    # (``reuse.written``): where none was written into, the texts are the last block's, else they are read.
    model = Net()
    _reprs(model)
    _reprs(model)
    after = _reprs(model, change)
    assert after == _expected(model) and after[module] == text


def test_a_change_inside_the_block_is_seen() -> None:
    # Covered by no check at the block's start: a parameter set to None while profiling, a hyperparameter.
    model = Net()
    _reprs(model)
    after = _reprs(model, lambda m: (_set_bias_none(m), setattr(m.dropout, "p", 0.1)))
    assert after == _expected(model)
    assert after["linear"] == "in_features=8, out_features=8, bias=False" and after["dropout"] == "p=0.1, inplace=False"


def test_a_mutable_attribute_is_read_every_time(counted: list[str]) -> None:
    model = Net()
    model.spare = nn.LayerNorm(8)  # not called by forward
    model.spare.normalized_shape = [8]  # a list: it could change in place, so its text is not kept
    _reprs(model)
    counted.clear()
    model.spare.normalized_shape.append(1)
    assert _reprs(model)["spare"] == f"[8, 1], eps=1e-05, elementwise_affine=True{LAYER_NORM_BIAS}"
    assert counted == ["LayerNorm"]  # the spare's: the others kept theirs


def test_a_replaced_class_function_and_a_subclass_are_called(monkeypatch: pytest.MonkeyPatch) -> None:
    class Mine(nn.Linear):
        @property
        def in_features(self) -> int:
            return self.weight.shape[1] * self.factor

        @in_features.setter
        def in_features(self, value: int) -> None:
            pass

    model = Net()
    model.linear = Mine(8, 8)
    model.linear.factor = 1
    _reprs(model)
    model.linear.factor = 2  # read through the property: not in the snapshot, yet the text changes
    assert _reprs(model)["linear"] == "in_features=16, out_features=8, bias=True"
    monkeypatch.setattr(nn.Dropout, "extra_repr", lambda self: "patched")
    assert _reprs(model)["dropout"] == "patched"


def test_the_snapshot_holds_no_table_nor_tensor_of_the_module() -> None:
    model = Net()
    _reprs(model)
    kept = {kind.__name__: group for kind, group in reuse._PLANS[model].reprs.items()}
    # linear's in and out features, the norm's shape, eps, affine, dropout's p and inplace, ReLU's inplace
    assert {name: group.values for name, group in kept.items()} == {
        "Linear": [8, 8], "LayerNorm": [(8,), 1e-05, True], "Dropout": [0.5, False], "ReLU": [False]}
    assert {name: group.no_bias for name, group in kept.items()} == {
        "Linear": [False], "LayerNorm": [False], "Dropout": None, "ReLU": None}


def test_a_changed_module_of_a_class_is_read_alone(counted: list[str]) -> None:
    # Three Linears: a change to the middle one's values calls its extra_repr only, the others keep their texts.
    model = Net()
    model.more = nn.ModuleList([nn.Linear(8, 4), nn.Linear(4, 8)])  # not called by forward
    _reprs(model)
    counted.clear()
    model.more[0].out_features = 5
    after = _reprs(model)
    assert counted == ["Linear"] and after == _expected(model)
    assert after["more.0"] == "in_features=8, out_features=5, bias=True"
    counted.clear()
    assert _reprs(model) == after and counted == []  # kept again


def _attributes_read(function: Callable[..., str]) -> set[str]:
    """The module attributes an extra_repr reads, from the installed torch's source: ``self.name``, and each
    ``{name}`` field of its strings where it formats ``**self.__dict__`` (less the fields given as keywords)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "self"} - {"__dict__"}
    formats = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
               and any(keyword.arg is None and ast.unparse(keyword.value) == "self.__dict__"
                       for keyword in node.keywords)]
    if formats:
        fields = {field for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  for _, field, _, _ in string.Formatter().parse(node.value) if field}
        read |= fields - {keyword.arg for node in formats for keyword in node.keywords if keyword.arg}
    return read


@pytest.mark.parametrize("function", list(reprs._READS), ids=lambda function: function.__qualname__)
def test_a_kept_text_is_checked_against_every_attribute_its_function_reads(function: Callable[..., str]) -> None:
    # The snapshot keeps a text while the values it holds are the same: every attribute this torch's function
    # formats must be among them (the norms read their bias in torch 2.14, not in 2.11: a check of more is
    # harmless, of fewer would keep a stale text).
    getter, width, reads_bias = reprs._READS[function]
    held = set(getter.__reduce__()[1]) | ({"bias"} if reads_bias else set())
    assert len(held) == width + reads_bias
    assert _attributes_read(function) <= held


class _OwnRepr(nn.Module):
    """A layer that says what it is in ``__repr__`` and not in ``extra_repr``, as PyTorch Geometric's do
    (``Linear(16, 32, bias=True)``, ``GCNConv(16, 32)``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.ones(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.width}, {self.width}, bias=False)"


class _OwnReprAround(nn.Module):
    """A module with a child and a ``__repr__`` of its own, which names the child: nothing of it goes in the
    annotated line (the child has its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _OwnRepr(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)

    def __repr__(self) -> str:
        return f"Around(inner={self.inner!r})"


def test_a_layer_that_says_what_it_is_in_its_own_repr_keeps_it_in_the_summary() -> None:
    model = nn.Sequential(_OwnReprAround(), _OwnRepr(4))
    for _ in range(2):  # a first block walks the model, the second reuses its plan: both read the texts
        with LayerProf(model) as prof:
            model(torch.randn(2, 4)).sum().backward()
        assert prof.records["1"].extra_repr == prof.records["0.inner"].extra_repr == "4, 4, bias=False"
        assert prof.records["0"].extra_repr == ""
        lines = prof.layerwise_summary().splitlines()
        assert any(line.strip().startswith("(1): _OwnRepr【") and line.endswith("】(4, 4, bias=False)")
                   for line in lines)
