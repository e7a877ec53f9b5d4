"""The live-bytes reader's time comes off a recomputation's price (``layerprof.collect.live_op_cost``): a plan from a
one-step ``live_memory`` profile is priced as one from a ``memory`` profile is, on a tiny GPT-2 from its config."""
from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import layerprof
from layerprof.collect import live_op_cost as reader
from layerprof.collect.live_op_cost import live_op_cost
from layerprof.plan.candidates import candidates

from .measured import measured_until

transformers = pytest.importorskip("transformers")

ROUNDS = 9
LAYERS = ("transformer.h.0", "transformer.h.1")  # the layers: most of the forward's ops


def _gpt2() -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64,
                                     use_cache=False)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 1000, (2, 64))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    return model, step


def _one_step(model: torch.nn.Module, step: Any, metrics: tuple[str, ...]) -> layerprof.Profile:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step, its times under the distorting meter: the case at hand
        with layerprof.LayerProf(model, metrics=metrics) as prof:
            step()
    return prof.profile


def _recompute_ms(profile: layerprof.Profile, names: tuple[str, ...], op_ms: float) -> float:
    """The recompute ms of the modules ``names`` in ``profile``, the reader's ``op_ms`` per op taken off."""
    found = candidates(profile.tree, hook_ms=profile._measured("hook_ms"), op_ms=op_ms)  # as checkpoint_plan prices it
    return sum(candidate.recompute_ms for candidate in found if candidate.name in names)


def _priced(model: torch.nn.Module, step: Any) -> tuple[float, float, Any, layerprof.Profile, list[float]]:
    """One attempt, the reader's figure measured afresh: (the live profile's price of the two layers over the
    memory profile's, before and after the reader's time is taken off; the verified 50 % plan of the last live
    profile; that profile; the last round's (before, after))."""
    reader._CACHE.clear()  # a retry calibrates again: a burst in the calibration is as likely as one in a step
    plain, before, after = [], [], []
    for _ in range(ROUNDS):
        memory = _one_step(model, step, ("memory", "shapes"))
        live = _one_step(model, step, ("live_memory", "shapes"))
        plain.append(_recompute_ms(memory, LAYERS, 0.0))
        before.append(_recompute_ms(live, LAYERS, 0.0))
        assert "live_op_ms" not in live.meta  # measured when the profile is first planned or saved
        after.append(_recompute_ms(live, LAYERS, live._measured("live_op_ms")))
    plan = live.checkpoint_plan("50%", wrap_cost=None)
    # Five steps each side: the median of two is their mean, which one preempted step moves by half its delay.
    result = layerprof.verify_plan(plan, model, step, repeats=5)
    # The least of each, interleaved: load only adds time (the median of a loaded host's is 1.3-1.5x, as the reader
    # slows more, in wall time, than in the thread time it is priced in).
    return min(before) / min(plain), min(after) / min(plain), result, live, [before[-1], after[-1]]


def _holds(found: tuple[float, float, Any, layerprof.Profile, list[float]]) -> bool:
    before_ratio, after_ratio, result = found[:3]
    return (abs(after_ratio - 1.0) < abs(before_ratio - 1.0)
            and 0 < result.predicted_extra_ms < 3 * result.measured_extra_ms + 1.0
            and not found[3].checkpoint_plan("50%", wrap_cost=None).host_figures_high)


def test_live_profile_prices_a_plan_as_a_memory_profile() -> None:
    model, step = _gpt2()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a loaded host, several threads' spin-waits swamp the figures compared
    try:
        step()
        found = measured_until(3, lambda: _priced(model, step), _holds)
    finally:
        torch.set_num_threads(threads)
    before_ratio, after_ratio, result, live, (before, after) = found
    assert live.meta["live_op_ms"] == live_op_cost()  # once per process (per attempt here: measured afresh)
    # Measured right, no module loses more than its profiled forward to the reader's time and the hooks' (at most
    # 0.86 of it here; 0.80-0.93 over the zoo's live profiles): the plan does not say the figures read high. A
    # calibration can read high on a busy host (the least of its watched rounds all loaded, of its bare rounds
    # one not), so this is one of the conditions retried above.
    assert not live.checkpoint_plan("50%", wrap_cost=None).host_figures_high
    # Before, the live profile priced the two layers at twice the memory profile's (7.6-8.1 ms against 3.9-4.1 on
    # a loaded 2-core VM, one thread); with the reader's ~16 µs on each of their ops taken off, 4.3-4.8 ms.
    # The reader's time taken off is exactly its ops in the two layers times its figure.
    ops = sum(live.records[name].live_forward_ops for name in LAYERS)
    assert before - after == pytest.approx(ops * live.meta["live_op_ms"])
    # Within 25 % (1.07-1.19, 1.6-2.0 before) in three runs on a 2-core VM under a load of 9; under a load that
    # swings within the test, 1.3-1.9 (1.5-2.8 before): the reader slows more in wall time than in the thread time
    # it is priced in. So the band here is that the live profile's price comes nearer the memory profile's.
    # (A figure 1.9x the reader's cost or more fails it: 2x read 0.02 against 1.86 before.)
    assert abs(after_ratio - 1.0) < abs(before_ratio - 1.0), (before_ratio, after_ratio)
    # The plan priced from the live profile against its recomputation timed on the model (bare steps; loaded host:
    # 2.1-2.8 ms predicted, 1.2-5.9 measured; idle: 0.50-1.05 of measured, five attempts). A loose bound, which a
    # loaded host's steps stay within: a plan priced with the reader's time (2x) is caught by the check above.
    assert 0 < result.predicted_extra_ms < 3 * result.measured_extra_ms + 1.0
