"""The checkpoint planner's recompute times under torch.autocast, against what ``plan.verify`` measures.

A convolution wrapped by itself re-runs only autocast's cast of its weight (checkpoint's early stop ends the
recomputation at its save, before the product), which the planner priced as its whole forward: 2x on resnet18."""
import statistics
import warnings

import pytest
import torch

import layerprof
from layerprof.plan.plan import _cast_of

torchvision = pytest.importorskip("torchvision")


def _profile(model, step, steps=4):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with layerprof.LayerProf(model, metrics=("memory", "shapes")) as prof:
            for _ in range(steps):
                step()
                prof.step()
    return prof


def _resnet(autocast):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).float().sum()
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()
    return model, step


def test_resnet18_bf16_autocast_recompute_matches_verify():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, step = _resnet(autocast=True)
        prof = _profile(model, step)
        plan = prof.checkpoint_plan(0.5)
        assert plan.chosen
        # Each verification is the median over its steps; the ratios' median over three verifications.
        ratios: dict[str, list[float]] = {name: [] for name in plan.modules}
        totals = []
        for _ in range(3):
            result = plan.verify(model, step, repeats=5)
            for name, (predicted, measured) in result.recompute_ms.items():
                ratios[name].append(predicted / measured)
            totals.append(sum(p for p, _ in result.recompute_ms.values())
                          / sum(m for _, m in result.recompute_ms.values()))
    finally:
        torch.set_num_threads(threads)
    # Priced as the whole forward, the ratio read 1.8-2.0; a shared 2-core host moves it by about 25 %.
    for name, found in ratios.items():
        assert 0.55 < statistics.median(found) < 1.45, (name, found)
    assert 0.6 < statistics.median(totals) < 1.4, totals


def test_float32_profile_prices_forward_as_before():
    model, step = _resnet(autocast=False)
    prof = _profile(model, step, steps=2)
    assert _cast_of(prof.profile.tree, {"autocast": False}) is None
    found = {c.name: c for c in layerprof.plan.candidates.candidates(prof.profile.tree)}
    record = prof.profile.records["layer4.0.conv2"]
    assert found["layer4.0.conv2"].recompute_ms == pytest.approx(record.forward_ms_median)
