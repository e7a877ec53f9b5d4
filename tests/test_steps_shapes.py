"""Many steps of a training loop whose work changes from step to step: modules run on some steps only (an
auxiliary head, stochastic depth), shapes that change, and a loop that raises half way."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from layerprof.collect import profiler
from layerprof.cli import main
from layerprof.record.fields import FIELDS
from layerprof.render.gate import different_models

GIVEN = {"flops": 1e9, "bandwidth": 1e6}  # round roofs: the roofline's figures follow from the records exactly


class SometimesNet(nn.Module):
    """``body`` runs every step, ``aux`` on steps 0 and 5 (an auxiliary head every 5 steps), ``skip`` on odd
    steps (a layer that stochastic depth drops every other step)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.aux, self.skip = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        h = self.body(x)
        if step % 5 == 0:
            h = self.aux(h)
        if step % 2 == 1:
            h = self.skip(h)
        return h.sum()


def run_sometimes(steps: int = 10, **kwargs) -> LayerProf:
    torch.manual_seed(0)
    net = SometimesNet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(net, **kwargs) as prof:
            for step in range(steps):
                net(torch.randn(4, 16), step).backward()
                prof.step()
    return prof


def test_rates_of_a_module_run_in_some_steps_are_over_the_steps_that_ran_it() -> None:
    """FLOPs are counted in step 0, which ran ``aux``; its times are means over the 9 timed steps, 0 in the 8 that
    did not run it. FLOP/s and the roofline set the FLOPs beside its time in the step that ran it (before: beside
    the mean over all 9 steps, so ``aux`` read 9 times as fast as ``body``, the same layer)."""
    prof = run_sometimes(metrics=("flops",), peaks=GIVEN)
    body, aux = prof.records["body"], prof.records["aux"]
    assert (body.steps, body.steps_run, aux.steps, aux.steps_run) == (9, 9, 9, 1)  # aux ran in step 5 of 1-9
    # Linear(16, 16) on 4 rows: forward 2 * 4 * 16 * 16 = 2,048; backward 2,048 for the weight, and 2,048 more
    # for the input where it needs a gradient (aux's, not body's).
    assert (body.flops_forward, body.flops_backward) == (2048, 2048)
    assert (aux.flops_forward, aux.flops_backward) == (2048, 4096)
    ran_ms = FIELDS["total_ms"].value(aux) * 9  # the mean over 9 steps, 8 of them 0: the step that ran it
    assert ran_ms > 0
    assert FIELDS["flops_per_s"].value(aux) == pytest.approx(6144 / (ran_ms / 1000.0), rel=1e-12)
    self_ran_ms = FIELDS["self_total_ms"].value(aux) * 9
    assert FIELDS["achieved_bandwidth"].value(aux) == pytest.approx(aux.self_bytes / (self_ran_ms / 1000.0),
                                                                     rel=1e-12)
    attainable = FIELDS["attainable_ms"].value(aux)
    assert attainable == pytest.approx(1000.0 * max(6144 / 1e9, aux.self_bytes / 1e6), rel=1e-12)
    assert FIELDS["efficiency"].value(aux) == pytest.approx(attainable / self_ran_ms, rel=1e-12)
    # Lost time stays per recorded step, as the self time beside it in the table: one step in 9 loses it.
    assert FIELDS["lost_ms"].value(aux) == pytest.approx(max(0.0, self_ran_ms - attainable) / 9, rel=1e-12)
    # A module that ran in every step reads as before.
    assert FIELDS["flops_per_s"].value(body) == pytest.approx(4096 / (FIELDS["total_ms"].value(body) / 1000.0))
    row = {row["name"]: row for row in prof.roofline()}["aux"]
    assert row["efficiency"] == FIELDS["efficiency"].value(aux)


def test_a_module_that_missed_the_counted_step_is_warned_of() -> None:
    """``skip`` runs on odd steps only, so not in step 0, the one the flops meter counts: its FLOPs are None and
    the root's leave it out. Said as the block ends (before: silently None, in 5 of the 9 timed steps it ran)."""
    torch.manual_seed(0)
    net = SometimesNet()
    with pytest.warns(RuntimeWarning, match=r"^1 module\(s\) \('skip'\) ran in recorded steps but not in the first "
                                         r"profiled step, the one that metrics \['flops'\] count"):
        with LayerProf(net, metrics=("flops",)) as prof:
            for step in range(10):
                net(torch.randn(4, 16), step).backward()
                prof.step()
    skip, root = prof.records["skip"], prof.records[""]
    assert (skip.steps_run, skip.flops_forward, skip.flops_backward) == (5, None, None)
    # body 2,048 + 2,048 and aux 2,048 + 4,096 (the test above); h.sum() counts no FLOP
    assert FIELDS["flops"].value(root) == 2048 + 2048 + 2048 + 4096


@pytest.mark.parametrize("compiled", [False, True])
def test_no_warning_where_the_counted_step_ran_every_module(compiled, monkeypatch) -> None:
    # In a process where torch.compile has compiled code, a module whose parameters hold gradients and that no step
    # was seen to run is warned of (a compiled region runs modules without their hooks): 'aux' ran in the counted
    # step, which the times leave out, and was warned of as unseen, after a torch.compile test in the same process.
    monkeypatch.setattr(profiler, "dynamo_compiled", lambda: compiled)
    torch.manual_seed(0)
    net = SometimesNet()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with LayerProf(net, metrics=("flops",)) as prof:
            for step in (5, 1, 2, 3):  # step 5 runs aux and skip; the others run fewer
                net(torch.randn(4, 16), step).backward()
                prof.step()
    assert [prof.records[name].flops_forward for name in ("body", "aux", "skip")] == [2048, 2048, 2048]


class FailsAt(nn.Module):
    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fc, self.fail_at, self.calls = nn.Linear(4, 4), fail_at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at + 1:
            raise ValueError("loss is NaN")
        return self.fc(x)


def test_a_block_that_raised_after_recorded_steps_says_how_to_keep_them() -> None:
    """Three steps recorded, the fourth raised: the block keeps none of them (all or nothing), and the message says
    so and how to keep them (before: "so nothing was recorded", with no way named)."""
    net = FailsAt(3)
    with pytest.raises(ValueError, match="loss is NaN"):
        with LayerProf(net) as prof:
            for _ in range(5):
                net(torch.randn(2, 4)).sum().backward()
                prof.step()
    with pytest.raises(RuntimeError) as info:
        prof.layerwise_summary()
    assert str(info.value) == (
        "no profile: the block raised ValueError in step 3 (counted from 0), after 3 recorded step(s), and a "
        "`with LayerProf(model)` block that raises keeps none. To keep the steps completed before an error, "
        "profile with prof = LayerProf(model).start() and call prof.stop(partial=str(error), error=error) in your "
        "`except`; or fix the error and profile again with a new LayerProf(model)")
    # What it says works, and keeps the three steps, with the step the flops meter counted among them.
    net = FailsAt(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = LayerProf(net, metrics=("flops",)).start()
        try:
            for _ in range(5):
                net(torch.randn(2, 4)).sum().backward()
                prof.step()
        except ValueError as error:
            prof.stop(partial=str(error), error=error)
    assert prof.layerwise_summary(depth=0).splitlines()[0] == "Partial profile (2 steps recorded): loss is NaN."
    assert prof.records["fc"].flops_forward == 2 * 2 * 4 * 4  # counted in step 0: 2 rows, 4 -> 4


def test_multi_scale_steps_against_one_image_size_are_not_one_workload(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Multi-scale training (16, 24 and 32 pixels, in turn) gated against the same model at 16 pixels only: before,
    the gate judged them one workload (the multi-scale profile names no one input shape) and passed a step that is
    3 times the work, "within the noise". Now refused, as two fixed sizes are; two multi-scale runs are not."""
    def profiled(sizes: list[int]) -> layerprof.Profile:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        with LayerProf(net) as prof:
            for size in sizes:
                net(torch.randn(2, 3, size, size)).sum().backward()
                prof.step()
        return prof.profile

    fixed, scales = profiled([16] * 6), profiled([16, 24, 32] * 2)
    assert fixed.meta["environment"]["input_shape"] == [2, 3, 16, 16]
    assert "input_shape" not in scales.meta["environment"]
    assert scales.meta["environment"]["input_shape_variants"] == 3
    assert different_models(fixed, scales) == (
        "A was profiled on inputs of one shape, [2, 3, 16, 16], and B on inputs of 3 shapes (other than the batch: "
        "sequence lengths or image sizes that change from step to step)")
    assert different_models(scales, fixed).startswith("B was profiled on inputs of one shape, [2, 3, 16, 16], and A")
    assert different_models(scales, profiled([32, 16, 24] * 2)) is None
    path_a, path_b = tmp_path / "a.json", tmp_path / "b.json"
    fixed.to_json(path_a)
    scales.to_json(path_b)
    assert main(["compare", str(path_a), str(path_b), "--fail-if-slower", "10"]) == 4
    assert "and B on inputs of 3 shapes" in capsys.readouterr().err
