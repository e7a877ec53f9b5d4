"""Modules compiled in place (``module.compile()``, a compiled ``forward``) are refused by name, before anything is
hooked, and a module compiled while profiling makes the profile fail rather than be partial. Detection needs no
compiling: ``.compile()`` only stores a wrapper, which compiles at its first call."""
from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state

_CONSEQUENCE = (
    "dynamo traces its calls, layerprof's hooks included, so its modules would get partial times (no backward, "
    "graphs broken and recompiled at every hook) instead of the eager model's. Profile the eager model: before "
    "calling .compile(), or an eager copy (copy.deepcopy(model) leaves the .compile() out); compile after profiling."
)


def model_with_block() -> nn.Sequential:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(block), nn.Linear(8, 1))


def profile_step(model: nn.Module) -> LayerProf:
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    return prof


def test_child_compiled_in_place_is_refused_by_name_before_any_hook() -> None:
    model = model_with_block()
    model[2][0].compile()  # nothing is compiled until its first call: detection must not need it
    impl = model[2][0]._compiled_call_impl
    before = hook_state(model)
    with pytest.raises(TypeError) as info:
        LayerProf(model)
    assert str(info.value) == (
        "LayerProf cannot profile a module compiled in place: module '2.0' (Sequential) was compiled in place with "
        ".compile(): " + _CONSEQUENCE
    )
    assert hook_state(model) == before and not _PROFILED
    assert model[2][0]._compiled_call_impl is impl  # the user's compile is kept


def test_root_compiled_in_place_is_refused() -> None:
    model = model_with_block()
    model.compile(mode="reduce-overhead")
    with pytest.raises(TypeError, match=re.escape("module compiled in place: the model (Sequential) was compiled in "
                                                  "place with .compile(): dynamo traces")):
        LayerProf(model)


class CompiledForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @torch.compile
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class DisabledForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_compiled_forward_is_refused() -> None:
    # a compiled method of the class
    model = nn.Sequential(nn.Linear(4, 4), CompiledForward())
    with pytest.raises(TypeError) as info:
        LayerProf(model)
    assert str(info.value).startswith("LayerProf cannot profile a module compiled in place: the forward of module '1' "
                                      "(CompiledForward) is a torch.compile'd function: dynamo traces its calls")
    assert str(info.value).endswith("instead of the eager model's. Profile the model with its eager forward, and "
                                    "compile after profiling.")
    # a compiled function put on the instance
    model = model_with_block()
    model[3].forward = torch.compile(model[3].forward)
    with pytest.raises(TypeError, match=re.escape("the forward of module '3' (Linear) is a torch.compile'd")):
        LayerProf(model)


class LaterCompiled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_class_forward_compiled_after_a_profile_saw_it_eager_is_refused() -> None:
    # The eager forward was looked at (and remembered as eager) by the first profile; the compiled one is new.
    model = nn.Sequential(nn.Linear(4, 4), LaterCompiled())
    profile_step(model)
    eager = LaterCompiled.forward
    LaterCompiled.forward = torch.compile(eager)
    try:
        with pytest.raises(TypeError, match=re.escape("the forward of module '1' (LaterCompiled) is a torch.compile'd")):
            with LayerProf(model):  # a model profiled before is checked when the block starts
                pass
    finally:
        LaterCompiled.forward = eager
    assert profile_step(model).records["1"].calls == 1


@pytest.mark.parametrize("when", ["between", "inside"])
def test_a_class_forward_compiled_after_reused_blocks_is_refused(when: str) -> None:
    # From the second block on a plan, a block's start and end compare the classes' forwards with the functions the
    # plan last found eager (``Plan.eager``): a compiled forward is another function, read again and refused.
    model = nn.Sequential(nn.Linear(4, 4), LaterCompiled())
    for _ in range(3):
        profile_step(model)
    eager = LaterCompiled.forward
    try:
        if when == "between":
            LaterCompiled.forward = torch.compile(eager)
            with pytest.raises(TypeError, match=re.escape("the forward of module '1' (LaterCompiled) is a torch.compile'd")):
                with LayerProf(model):
                    pass
        else:
            with pytest.raises(RuntimeError, match=re.escape("module '1' (LaterCompiled)")):
                with LayerProf(model):
                    model(torch.randn(2, 4)).sum().backward()
                    LaterCompiled.forward = torch.compile(eager)
    finally:
        LaterCompiled.forward = eager
    assert not _PROFILED and profile_step(model).records["1"].calls == 1


def test_what_is_not_compiled_is_profiled_in_full() -> None:
    # compile(disable=True) stores the plain _call_impl, and torch.compiler.disable marks a wrapper that never
    # compiles: both run eagerly, hooks and all, so every module gets its forward and backward.
    model = nn.Sequential(nn.Linear(4, 4), DisabledForward(), model_with_block())
    model[2][2].compile(disable=True)
    prof = profile_step(model)
    for name in ("", "0", "1", "1.fc", "2", "2.2", "2.2.0", "2.2.0.0", "2.2.0.2"):
        record = prof.records[name]
        assert record.calls == 1 and record.forward_ms > 0 and record.backward_ms > 0, name


def test_compile_between_init_and_start_is_refused_at_start() -> None:
    model = model_with_block()
    prof = LayerProf(model)
    model[3].compile()
    before = hook_state(model)
    with pytest.raises(TypeError, match=re.escape("module '3' (Linear) was compiled in place with .compile()")):
        prof.start()
    assert hook_state(model) == before and not _PROFILED


def test_compile_inside_the_block_fails_the_profile_and_leaves_the_model_clean() -> None:
    model = model_with_block()
    before = hook_state(model)
    with pytest.raises(RuntimeError) as info:
        with LayerProf(model) as prof:
            model(torch.randn(2, 4)).sum().backward()
            model[2].compile(backend="eager")
    assert str(info.value) == (
        "the profile is refused: module '2' (Sequential) was compiled in place with .compile() while it was being "
        "profiled, and " + _CONSEQUENCE
    )
    assert not _PROFILED
    assert {name: state[:-1] for name, state in hook_state(model).items()} == {
        name: state[:-1] for name, state in before.items()}  # every hook dict as found (the compile added an attr)
    with pytest.raises(RuntimeError, match="no profile: computing the profile raised RuntimeError"):
        prof.profile
    # A fresh instance with the same weights profiles in full, and the compiled model still runs.
    fresh = model_with_block()
    fresh.load_state_dict(model.state_dict())
    assert profile_step(fresh).records["2.0.2"].backward_ms > 0
    x = torch.randn(2, 4)
    torch.testing.assert_close(model(x), fresh(x))


def test_compile_inside_a_block_after_reused_ones_fails_the_profile() -> None:
    # From the second block on, a block's end first compares the versions of the modules' dicts with the last
    # end's: .compile() writes into the module's, so the full check runs and refuses the profile.
    model = model_with_block()
    profile_step(model)
    profile_step(model)
    with pytest.raises(RuntimeError, match=re.escape("module '2.0' (Sequential) was compiled in place with .compile() "
                                                     "while it was being profiled")):
        with LayerProf(model):
            model(torch.randn(2, 4)).sum().backward()
            model[2][0].compile(backend="eager")
    assert not _PROFILED


def test_compile_between_reused_blocks_is_refused_at_start() -> None:
    # From the third block on, a block's start reads the versions of the modules' dicts instead of each module's
    # attributes: .compile() writes into the module's, so the full check runs and refuses the model by name.
    model = model_with_block()
    for _ in range(3):
        profile_step(model)
    model[2][0][2].compile()
    before = hook_state(model)
    with pytest.raises(TypeError, match=re.escape("module '2.0.2' (Linear) was compiled in place with .compile()")):
        with LayerProf(model):
            pass
    assert hook_state(model) == before and not _PROFILED


def test_a_compiled_child_run_under_dynamo_is_still_seen() -> None:
    # After its first (compiling) call the module carries the same mark: a model compiled, trained and then
    # handed to LayerProf is refused, not half-profiled. backend="eager" runs dynamo without a C compiler.
    model = model_with_block()
    model[2].compile(backend="eager")
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(TypeError, match=re.escape("module '2' (Sequential) was compiled in place")):
        LayerProf(model)
    eager = copy.deepcopy(model)  # the advice: a deep copy leaves the .compile() out, and is profiled in full
    prof = profile_step(eager)
    assert all(prof.records[name].backward_ms > 0 for name in ("2", "2.0", "2.0.0", "2.0.2"))


def test_a_compiled_wrapper_put_in_the_model_inside_the_block_fails_the_profile() -> None:
    model = model_with_block()
    before = hook_state(model)
    with pytest.raises(RuntimeError) as info:
        with LayerProf(model):
            model(torch.randn(2, 4)).sum().backward()
            model[2] = torch.compile(model[2], backend="eager")  # registered while profiling: not called here
    assert str(info.value).startswith("the profile is refused: module '2' became a torch.compile'd module while it "
                                      "was being profiled, and dynamo traces its calls")
    assert not _PROFILED
    model[2] = model[2]._orig_mod
    # every hook dict as found (torch.compile itself marks the module it wraps with an attribute)
    assert {name: state[:-1] for name, state in hook_state(model).items()} == {
        name: state[:-1] for name, state in before.items()}


def test_with_dynamo_disabled_a_compiled_module_runs_eagerly_and_is_profiled() -> None:
    # TORCH_COMPILE_DISABLE=1 sets this: compiled wrappers then run their function eagerly, hooks and all. Set
    # through dynamo's own ``config.patch``, not ``monkeypatch.setattr``: pytest >= 9.2 undoes a setattr on a
    # module by deleting the attribute when it was not in the module's ``__dict__`` (dynamo's config answers
    # through ``__getattr__``), and dynamo then hides ``config.disable``, so every later torch.compile raised.
    model = model_with_block()
    model[2].compile(backend="eager")
    with torch._dynamo.config.patch(disable=True):
        prof = profile_step(model)
    for name in ("2", "2.0", "2.0.0", "2.0.2"):
        assert prof.records[name].calls == 1 and prof.records[name].backward_ms > 0, name


@pytest.mark.parametrize("whole", [True, False])
def test_a_model_called_through_a_compiled_wrapper_held_apart_is_refused_before_it_compiles(whole: bool) -> None:
    """``compiled = torch.compile(model)`` then ``compiled(x)`` in a block on ``model``: dynamo traced layerprof's
    hooks and the root's forward read the compilation (seconds) with no error. The wrapper's own call comes first
    (through the block's call wrapper, in eager): it is refused there, before dynamo runs, and nothing stays on the
    model; the same for a child's wrapper called from the model, while other compiled modules run."""
    model = model_with_block()
    compiled = torch.compile(model if whole else model[2], backend="eager")
    before = hook_state(model)  # (as compile left it)
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError) as info:
        with LayerProf(model) as prof:
            (compiled(x) if whole else compiled(model[1](model[0](x)))).sum().backward()
    shown, what = ("the model", "model") if whole else ("module '2'", "module")
    assert str(info.value) == (
        f"the profile is refused: {shown} was called through torch.compile({what}), a compiled wrapper of it held "
        "apart from it, and dynamo traces its calls, layerprof's hooks included, so its modules would get partial "
        "times (no backward, graphs broken and recompiled at every hook) instead of the eager model's. Call the "
        f"{what} itself inside the block, and the compiled wrapper outside it.")
    assert not _PROFILED and hook_state(model) == before
    with pytest.raises(RuntimeError, match="no profile: the block raised RuntimeError"):
        prof.profile
    unrelated = torch.compile(nn.Linear(4, 4), backend="eager")  # another model's wrapper is not this model's
    with LayerProf(model) as prof:
        model(unrelated(x)).sum().backward()
    assert prof.records["2.0.2"].backward_ms > 0
    torch.testing.assert_close(compiled(x) if whole else compiled(model[1](model[0](x))),
                               model(x) if whole else model[2](model[1](model[0](x))))


def test_verify_plan_of_a_step_through_a_compiled_wrapper_says_to_pass_an_eager_step() -> None:
    # The plan applied to compiled._orig_mod works under compile, but verify_plan's own profile of the step was
    # refused with a message about "the block" (verify_plan's, which the user never wrote).
    import layerprof

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    x = torch.randn(16, 8)
    with LayerProf(model, metrics=("memory",)) as prof:
        for _ in range(2):
            model(x).sum().backward()
            prof.step()
    plan = prof.profile.checkpoint_plan("50%", wrap_cost=None)
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(ValueError, match=r"verify_plan: step\(\) calls a torch.compile\(\) wrapper of the model, .*"
                                         r"Pass a step that calls the Sequential itself, eagerly"):
        layerprof.verify_plan(plan, model, lambda: compiled(x).sum().backward(), repeats=1)
    assert not plan.is_applied and not any("forward" in vars(module) for module in model.modules())
    result = layerprof.verify_plan(plan, model, lambda: model(x).sum().backward(), repeats=1)
    assert result.measured_saved_bytes == plan.saved_bytes_after


def proj_relu_class() -> type[nn.Module]:
    """A new class each call (a Linear, then relu), for a test to put under torch.compiler.disable."""

    class ProjRelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x).relu()

    return ProjRelu


# torch.compiler.disable on a class gives it a _call_impl of its own (torch's, wrapped): its calls skip
# nn.Module._call_impl, so the block's call wrapper, and are timed by hooks on the module instead.
DisabledClass = torch.compiler.disable(proj_relu_class())


def test_a_class_under_torch_compiler_disable_is_profiled_as_eager_code() -> None:
    model = nn.Sequential(nn.Linear(4, 8), DisabledClass(), nn.Linear(8, 1))
    before = hook_state(model)
    prof = profile_step(model)
    for name in ("", "0", "1", "1.proj", "2"):
        record = prof.records[name]
        assert record.calls == 1 and record.forward_ms > 0 and record.backward_ms > 0, name
    assert hook_state(model) == before


def test_a_disabled_compile_inside_the_block_keeps_torchs_call_impl_after_it() -> None:
    # .compile(disable=True) stores the module's _call_impl as it finds it, bound to the module: inside a block,
    # the block's call wrapper. The block's end gives the module torch's own instead, so nothing of the block
    # stays on it (nor runs at its later calls), and the calls after the .compile() are profiled.
    model = model_with_block()
    x = torch.randn(2, 4)
    with LayerProf(model) as prof:
        model(x).sum().backward()
        model[3].compile(disable=True)
        model(x).sum().backward()
    held = model[3]._compiled_call_impl
    assert held.__func__ is vars(nn.Module)["_call_impl"] and held.__self__ is model[3]
    assert prof.records["3"].calls == 2 and prof.records["3"].backward_ms > 0
    assert prof.tree.calls == 2
    assert torch.equal(model(x), copy.deepcopy(model)(x))


def test_a_disabled_compile_inside_a_block_put_around_another_tools_call_impl_keeps_theirs_after_it() -> None:
    # Where another tool's function stands in nn.Module, the block puts its call wrapper in the class around it
    # (not inside torch's function): .compile(disable=True) then stores the wrapper's chain, bound to the module,
    # and the block's end gives the module the other tool's function instead.
    model = model_with_block()
    x = torch.randn(2, 4)
    torch_call = vars(nn.Module)["_call_impl"]

    def theirs(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return torch_call(module, *args, **kwargs)

    nn.Module._call_impl = theirs
    try:
        with LayerProf(model) as prof:
            assert vars(nn.Module)["_call_impl"] not in (theirs, torch_call)  # (the chain, in the class)
            model[3].compile(disable=True)
            model(x).sum().backward()
        held = model[3]._compiled_call_impl
        assert held.__func__ is theirs and held.__self__ is model[3]
        assert vars(nn.Module)["_call_impl"] is theirs
    finally:
        nn.Module._call_impl = torch_call
    assert prof.records["3"].calls == 1 and prof.records["3"].backward_ms > 0
    assert torch.equal(model(x), copy.deepcopy(model)(x))


@pytest.mark.parametrize("when", [0, 1], ids=["in a wait step", "in a recorded step"])
def test_a_disabled_compile_made_during_a_schedule_is_timed_in_the_later_recorded_steps(when: int) -> None:
    # A schedule attaches again after each wait: the modules calling around the wrapper are read then, not kept
    # from the block's start (the .compile()'d module's calls skip the new wrapper: it read 0.5 calls a step).
    import layerprof

    model, x = model_with_block(), torch.randn(2, 4)
    with LayerProf(model, schedule=layerprof.schedule(wait=1, active=1, repeat=2)) as prof:
        for step in range(4):  # wait, record, wait, record
            model(x).sum().backward()
            if step == when:
                model[3].compile(disable=True)
            prof.step()
    assert prof.tree.steps == 2
    for name in ("", "0", "3"):
        assert prof.records[name].calls == 1 and prof.records[name].backward_ms > 0, name
    with LayerProf(model) as later:  # and in the blocks after it, on the same plan
        model(x).sum().backward()
    assert later.records["3"].calls == 1 and later.records["3"].backward_ms > 0


def test_a_class_put_under_torch_compiler_disable_after_a_profile_is_timed_in_the_next() -> None:
    # torch.compiler.disable(cls) gives the class a _call_impl of its own: read at every block's start (the plan's
    # modules and their dicts are unchanged), so its instances get hooks of their own from the next block.
    Later = proj_relu_class()
    model = nn.Sequential(nn.Linear(4, 8), Later(), nn.Linear(8, 1))
    for decorate in (False, False, True):
        if decorate:
            torch.compiler.disable(Later)
        prof = profile_step(model)
        for name in ("1", "1.proj"):
            assert prof.records[name].calls == 1 and prof.records[name].backward_ms > 0, (name, decorate)


def test_dynamo_imported_for_the_first_time_inside_a_block_keeps_torchs_call_impl() -> None:
    # Dynamo keeps Module._call_impl as it finds it at its import (to tell a module call it can skip to forward):
    # imported inside a block, the block's wrapper. The block's end gives it torch's back (in a fresh process:
    # this one imported dynamo long ago).
    import subprocess
    import sys

    code = (
        "import sys, torch\nfrom torch import nn\nfrom layerprof import LayerProf\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "torch_call = vars(nn.Module)['_call_impl']\nmodel = nn.Linear(2, 2)\n"
        "with LayerProf(model):\n    import torch._dynamo.utils, torch._dynamo.variables.nn_module\n"
        "    model(torch.randn(1, 2))\n"
        "from torch._dynamo import utils\nfrom torch._dynamo.variables import nn_module\n"
        "print(utils.unpatched_nn_module_call_impl is torch_call,"
        " nn_module.unpatched_nn_module_call_impl is torch_call, vars(nn.Module)['_call_impl'] is torch_call)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "True"]


class _Region(nn.Module):
    """Compiles a region: a torch.compile'd function inside its forward that calls a submodule (``block``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Linear(16, 32)
        self.block = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 1)
        self.region = torch.compile(self._region, backend="eager")

    def _region(self, h: torch.Tensor) -> torch.Tensor:
        return self.block(h) + h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.region(self.emb(x)))


@pytest.mark.parametrize("first", ["before the block", "inside the block"])
def test_modules_a_compiled_region_ran_are_named_not_silently_not_run(first: str) -> None:
    """The compiled graph of a region calls no module hook: its modules cannot be measured, and the block says
    which (they used to read "not run" without a word, their weights holding gradients). Compiled first inside the
    block, dynamo traces them without layerprof's hooks: one graph, no recompilation at the hooks (up to 7 before)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, x = _Region(), torch.randn(8, 16)
    plain = _Region()
    plain(x).sum().backward()
    if first == "before the block":
        model(x).sum().backward()
        model.zero_grad()
    with pytest.warns(RuntimeWarning, match=r"1 module\(s\) were not seen to run, yet parameters in them hold "
                                            r"gradients \('block'\).*torch.compile'd function"):
        with LayerProf(model) as prof:
            for _ in range(2):
                model.zero_grad()
                model(x).sum().backward()
                prof.step()
    assert prof.profile.meta["unseen_with_gradients"] == ["block"]
    assert prof.records["block"].calls == 0 and prof.records["head"].calls == 1
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), plain.parameters()))
    assert counters["stats"]["unique_graphs"] == 1
    assert hook_state(model) == hook_state(_Region())


def test_modules_not_run_with_no_fresh_gradient_are_not_named() -> None:
    """A head the step does not use: no gradient (set to None), or zeros (``zero_grad(set_to_none=False)``)."""
    model = nn.ModuleDict({"body": nn.Linear(4, 4), "unused": nn.Linear(4, 4)})
    for set_to_none in (True, False):
        model["unused"](torch.randn(2, 4)).sum().backward()
        model.zero_grad(set_to_none=set_to_none)
        with LayerProf(model) as prof:
            model["body"](torch.randn(2, 4)).sum().backward()
        assert prof.records["unused"].calls == 0 and "unseen_with_gradients" not in prof.profile.meta


def _compiled_once() -> None:
    """torch.compile has compiled a graph in this process (the warning's condition)."""
    torch.compile(lambda t: t + 1, backend="eager")(torch.ones(2))


def test_modules_eager_code_reads_uncalled_are_not_named_after_a_compile() -> None:
    """Eager code reads some parameters without calling their module: nn.MultiheadAttention its out_proj's weight,
    a ParameterList is never called, a parent its child's scale. None of that is a compiled region, also in a
    process that compiled something else (the second reading: every ViT was named)."""
    _compiled_once()

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.scales = nn.ParameterList([nn.Parameter(torch.ones(16))])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x) * self.scales[0]

    model = Scaled()
    with LayerProf(model) as prof:
        model(torch.randn(2, 5, 16)).sum().backward()
    assert "unseen_with_gradients" not in prof.profile.meta
    assert prof.records["layer.self_attn.out_proj"].calls == 0  # (read by its parent, never called)


def test_a_tied_weight_whose_module_is_never_called_is_not_named_after_a_compile() -> None:
    """T5's ``shared`` embedding is never called: its weight is the encoder's and decoder's ``embed_tokens``', which
    run. In a process that compiled something, the block named it (every T5 drew the warning); a tied weight is no
    evidence of a compiled region. A module of the region that holds a weight of its own is still named."""
    transformers = pytest.importorskip("transformers")
    _compiled_once()
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                                   decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5ForConditionalGeneration(config)
    ids = torch.randint(1, 100, (2, 6))
    with LayerProf(model) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    assert model.shared.weight is model.encoder.embed_tokens.weight and model.shared.weight.grad is not None
    assert prof.records["shared"].calls == 0 and prof.records["encoder.embed_tokens"].calls >= 1
    assert "unseen_with_gradients" not in prof.profile.meta

    class TiedRegion(_Region):  # the region's first Linear shares its weight with a module that runs eagerly
        def __init__(self) -> None:
            super().__init__()
            self.eager = nn.Linear(32, 32)
            self.block[0].weight = self.eager.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.region(self.eager(self.emb(x))))

    region = TiedRegion()
    with pytest.warns(RuntimeWarning, match=r"\('block'\)"):
        with LayerProf(region) as prof:
            region(torch.randn(8, 16)).sum().backward()
    assert prof.profile.meta["unseen_with_gradients"] == ["block"]  # block.0's bias, block.2's weights: its own


def test_a_module_seen_in_a_warm_up_step_is_not_named() -> None:
    _compiled_once()
    model = nn.ModuleDict({"body": nn.Linear(4, 4), "aux": nn.Linear(4, 4)})
    with LayerProf(model, warmup=1) as prof:
        for step in range(3):
            out = model["body"](torch.randn(2, 4))
            if step == 0:  # only in the warm-up step; its gradient stays (not cleared)
                out = model["aux"](out)
            out.sum().backward()
            prof.step()
    assert prof.records["aux"].calls == 0 and "unseen_with_gradients" not in prof.profile.meta


def test_a_compile_on_another_thread_does_not_blank_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compiler.is_compiling()`` reads a flag set process-wide for a whole compile, on any thread: the
    hooks ask ``is_dynamo_compiling()``, True only inside what dynamo traces (the second reading: every module read
    "not run" while another thread compiled)."""
    if not hasattr(torch.compiler, "_is_compiling_flag"):
        pytest.skip("this torch's is_compiling() reads no process-wide flag")
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)  # what a compile on another thread sets
    assert torch.compiler.is_compiling()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    assert prof.records["0"].calls == 1 and prof.records["0"].backward_ms > 0
