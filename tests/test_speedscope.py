"""The speedscope export: the file format, exact nesting, order, clamping, and self-time weights."""
from __future__ import annotations

import json

import torch

from layerprof import LayerProf
from layerprof.record.records import CallTiming, ModuleRecord
from layerprof.render.speedscope import SCHEMA, speedscope_document

from .models import SharedLoop


def check_evented(profile: dict, frames: int) -> list[tuple[int, float, float]]:
    """Events open and close like brackets, ``at`` never decreases; returns (frame, open, close) of each slice."""
    assert profile["type"] == "evented" and profile["unit"] == "milliseconds"
    stack: list[tuple[int, float]] = []
    slices = []
    last = profile["startValue"]
    for event in profile["events"]:
        assert event["at"] >= last
        last = event["at"]
        assert 0 <= event["frame"] < frames
        if event["type"] == "O":
            stack.append((event["frame"], event["at"]))
        else:
            assert event["type"] == "C" and stack and stack[-1][0] == event["frame"]
            frame, opened = stack.pop()
            slices.append((frame, opened, event["at"]))
    assert not stack and last == profile["endValue"]
    return slices


def test_real_profile_nests_and_weights_add_up() -> None:
    net = SharedLoop()  # a module called several times per step
    with LayerProf(net) as prof:
        for _ in range(2):
            net(torch.randn(2, 8)).sum().backward()
            prof.step()
    doc = json.loads(prof.to_speedscope())
    assert doc["$schema"] == SCHEMA
    frames = doc["shared"]["frames"]
    assert [f["name"] for f in frames][0] == "SharedLoop"
    forward, backward, sampled = doc["profiles"]
    calls = sum(len(r.call_times) for r in prof.profile.records.values())
    assert len(check_evented(forward, len(frames))) == calls  # every forward call of both steps is a slice
    assert len(check_evented(backward, len(frames))) == sum(
        t.backward_ms is not None for r in prof.profile.records.values() for t in r.call_times)
    assert sampled["type"] == "sampled" and len(sampled["samples"]) == len(sampled["weights"])
    total_self = sum((r.self_forward_ms or 0) + (r.self_backward_ms or 0) for r in prof.profile.records.values())
    assert abs(sum(sampled["weights"]) - total_self) < 1e-9
    assert all(stack[0] == 0 for stack in sampled["samples"])  # every stack starts at the model


def test_children_are_clamped_into_parents() -> None:
    # Hand-built: child "a" starts inside the root but outlasts it by 2 ms; "b" starts after the root ended.
    root = ModuleRecord("", "Net")
    child = ModuleRecord("a", "Linear", parent=root)
    later = ModuleRecord("b", "ReLU", parent=root)
    root.call_times = [CallTiming(0.0, 10.0)]
    child.call_times = [CallTiming(4.0, 8.0)]  # 4..12, clamped to 4..10
    later.call_times = [CallTiming(11.0, 1.0)]  # after the root: a top-level slice, not nested
    forward = speedscope_document(root)["profiles"][0]
    assert [(e["type"], e["frame"], e["at"]) for e in forward["events"]] == [
        ("O", 0, 0.0), ("O", 1, 4.0), ("C", 1, 10.0), ("C", 0, 10.0), ("O", 2, 11.0), ("C", 2, 12.0)]
