"""A second reading of recent commits: cases found by using them as a user would."""
from __future__ import annotations

import collections
import copy
import re
import warnings

import pytest
import torch
from torch import nn

import layerprof

from layerprof import LayerProf
from layerprof.plan.apply import is_wrapped
from layerprof.plan.runs import parse_run

from .ranks import run_ranks


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(128, 128), nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b(nn.functional.gelu(self.a(x))))


def _named_sequential() -> nn.Sequential:
    """A Sequential of named children (as torchvision's DenseNet ``features``): its runs' children are not '0', '1'."""
    torch.manual_seed(0)
    blocks = [(f"b{i}", _Block()) for i in range(4)]
    return nn.Sequential(collections.OrderedDict([("inp", nn.Linear(16, 128)), *blocks, ("out", nn.Linear(128, 1))]))


def test_a_run_of_a_named_sequential_whose_child_differs_is_refused() -> None:
    """The structure check named a run's children '<parent>.<index>', which a Sequential of named children does not
    have: nothing was compared under the run, and a child grown under it applied with a warning that said 'the
    modules the plan wraps are as profiled'."""
    model, x = _named_sequential(), torch.randn(8, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory", "shapes")) as prof:
            model(x).sum().backward()
            prof.step()
    plans = [prof.checkpoint_plan(budget, wrap_cost=None) for budget in (0.1, 0.3, 0.2)]
    plan = next(plan for plan in plans if any(parse_run(name) for name in plan.modules))
    run = next(name for name in plan.modules if parse_run(name))
    first = parse_run(run)[1]
    other = copy.deepcopy(model)
    key = list(other._modules)[first]
    other._modules[key].extra = nn.Linear(2, 2)  # a layer the profiled child had not, under the wrapped run
    with pytest.raises(ValueError, match=re.escape(
            f"model: the plan wraps {run!r}, whose modules in this model are not the profiled model's (it has "
            f"'{key}.extra' that the profiled one had not)")):
        plan.apply(other)
    assert not any(is_wrapped(module) for module in other.modules()) and not plan.is_applied
    with warnings.catch_warnings():  # the very model: no refusal, no warning
        warnings.simplefilter("error")
        with plan.applied(model):
            assert plan.is_applied


def _one_rank_profile() -> layerprof.Profile:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
        prof.step()
    return prof.profile


def test_gather_saved_refuses_a_rank_past_the_jobs_size() -> None:
    """``gathered_from_saved`` checked a rank against the world size it had just raised to that rank (never
    outside): rank 3 given to a file without a rank, beside rank 0 of a 2-rank job, made a view of '2 of 4 ranks'
    with ranks 1 and 2 'missing'."""
    saved, unranked = _one_rank_profile(), _one_rank_profile()
    saved.meta["distributed"] = {"rank": 0, "world_size": 2, "backend": "gloo"}
    with pytest.raises(ValueError, match=r"rank 3 \(profile 1\) is outside a job of 2 ranks"):
        layerprof.gather_saved({0: saved, 3: unranked})
    gathered = layerprof.gather_saved({0: saved, 1: unranked})  # within the job: placed
    assert gathered.ranks == [0, 1] and gathered.world_size == 2 and gathered.failed_ranks == {}


def _subgroup_worker(rank: int) -> dict | None:
    import torch.distributed as dist

    group = dist.new_group([1])  # (every rank makes it; rank 1 alone is in it)
    if rank != 1:
        return None
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
        prof.step()
    gathered = prof.gather(dst=1, group=group)
    return {"header": gathered.table().splitlines()[0], "world_size": gathered.world_size,
            "ranks": gathered.ranks, "failed": gathered.failed_ranks}


def test_a_gather_over_a_subgroup_reads_as_the_groups_ranks(tmp_path) -> None:
    """The header's 'of N ranks' took N from the default group (the payloads' world size) and from the highest
    global rank: a gather over a one-rank group of a 2-rank job read 'Across 1 of 2 ranks', as if a rank had no
    profile, with nothing in failed_ranks to say which (before the header change it read 'Across 1 rank')."""
    results = run_ranks(_subgroup_worker, tmp_path)
    assert results[1] == {"header": results[1]["header"], "world_size": 1, "ranks": [1], "failed": {}}
    assert results[1]["header"].startswith("Across 1 rank, per step")


def test_mobilebert_names_the_head_s_dense_not_its_tied_decoder() -> None:
    """docs/internals.md said MobileBERT's prediction head's ``dense`` and ``decoder`` are named where it reads their
    weights uncalled; the decoder's weights are the word embeddings' and the head's ``bias`` (tied): only
    ``dense`` is."""
    transformers = pytest.importorskip("transformers")
    torch.compile(lambda t: t + 1, backend="eager")(torch.ones(2))  # (the warning's condition)
    config = transformers.MobileBertConfig(vocab_size=100, hidden_size=32, embedding_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=32, intra_bottleneck_size=16,
                                           true_hidden_size=16, num_feedforward_networks=1)
    model = transformers.MobileBertForMaskedLM(config)
    ids = torch.randint(1, 100, (2, 6))
    with pytest.warns(RuntimeWarning, match=r"\('cls\.predictions\.dense'\)"):
        with LayerProf(model) as prof:
            model(input_ids=ids, labels=ids).loss.backward()
    assert prof.profile.meta["unseen_with_gradients"] == ["cls.predictions.dense"]


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 128))
        self.norm = nn.LayerNorm(128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(16, 128), nn.Linear(128, 1)
        self.layers = nn.ModuleList(_Layer() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def test_a_submodule_compiled_after_profiling_below_a_wrapped_one_keeps_the_structure() -> None:
    """Compiling after profiling is what the docs advise: ``layer.mlp = torch.compile(layer.mlp)`` below a wrapped
    layer put its modules under ``mlp._orig_mod``, and the structure check refused the plan (it applied before the
    check), telling the user to profile the compiled model. A module grown under it is still refused."""
    model, x = _Stack(), torch.randn(8, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as prof:
            model(x).sum().backward()
            prof.step()
    plans = [prof.checkpoint_plan(budget, wrap_cost=None, runs=False) for budget in (0.5, 0.3, 0.2, 0.1)]
    plan = next(plan for plan in plans if any(re.fullmatch(r"layers\.\d", name) for name in plan.modules))
    layers = [name for name in plan.modules if re.fullmatch(r"layers\.\d", name)]
    grown = copy.deepcopy(model)
    for name in layers:  # (the mlp of a wrapped layer: below it, neither wrapped nor on a wrapped one's path)
        for layer in (model.get_submodule(name), grown.get_submodule(name)):
            layer.mlp = torch.compile(layer.mlp, backend="eager")
    with warnings.catch_warnings(record=True) as caught:  # (not "error": dynamo's own tracing warns)
        warnings.simplefilter("always")
        with plan.applied(model):
            assert all(is_wrapped(model.get_submodule(name)) for name in plan.modules)
            model(x).sum().backward()
    assert not [w for w in caught if "a model other than this one" in str(w.message)]
    target = layers[0]
    grown.get_submodule(target).mlp._orig_mod.append(nn.Identity())
    with pytest.raises(ValueError, match=re.escape(f"(it has '{target}.mlp.3' that the profiled one had not)")):
        plan.apply(grown)
