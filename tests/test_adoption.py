"""A call made outside every call of its module's ancestors counts in their inclusive figures (record/adoption.py):
time, FLOPs and memory, with their calls, call times and self figures their own. Transformers' ``generate()`` on
an encoder-decoder calls the encoder by itself, then the whole model once per token."""
from __future__ import annotations

import json
import pickle
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from layerprof.record.adoption import adopters

from .invariants import adopted_ms, check_profile, children_within, count_calls

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning")


def _call(name: str, parent: Any = None, recompute: bool = False, elsewhere: Any = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, parent=parent, recompute=recompute, elsewhere=elsewhere)


def test_adopters_are_the_ancestors_no_open_call_of_their_subtree_covers() -> None:
    root = _call("")
    model = _call("model", root)
    # Called by its parent: nothing to adopt.
    assert adopters(_call("model.encoder", model)) == ()
    # generate(): the encoder by itself, before the model; the root ("") too.
    assert adopters(_call("model.encoder")) == ("model", "")
    # A deeper module by itself: every ancestor up to the root.
    assert adopters(_call("model.encoder.layers.0")) == ("model.encoder.layers", "model.encoder", "model", "")
    # A root whose forward calls the encoder, then the model: the model adopts it, the root holds it already.
    assert adopters(_call("model.encoder", root)) == ("model",)
    # A child of a ModuleList its parent iterates: the list (which never runs, so adopts nothing in the end).
    assert adopters(_call("model.layers.0", model)) == ("model.layers",)
    # A sibling's forward calling it: its parent, whose subtree no open call is in; not the root, which is open.
    assert adopters(_call("b.inner", _call("a", root))) == ("b",)
    # A call inside another module of the ancestor's subtree is inside that one's call: covered.
    assert adopters(_call("model.decoder", _call("model.encoder"))) == ()
    # Recursion: inside a call of itself, covered by it.
    assert adopters(_call("model.encoder", _call("model.encoder", model))) == ()
    # The root and checkpoint re-runs adopt nothing.
    assert adopters(root) == () and adopters(_call("model.encoder", recompute=True)) == ()
    # A call on a thread of its own while the wrapper runs on another (DataParallel's replica of "module"):
    # inside the wrapper's call.
    assert adopters(_call("module", elsewhere=_call(""))) == ()
    assert adopters(_call("module.fc", elsewhere=_call("module", _call("")))) == ()


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class Wrapper(nn.Module):
    """Calls the encoder by itself, then the model (as a root whose forward calls generate())."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(x).sum() + self.model(x).sum()


def test_a_child_called_before_its_parent_counts_in_the_parent_and_the_root() -> None:
    torch.manual_seed(0)
    model, x = Model(), torch.randn(3, 4)
    model(x).sum().backward()
    with count_calls(model) as reference, LayerProf(model, metrics=("flops", "memory")) as prof:
        features = model.encoder(x)          # by itself, outside every call of the model
        (model(x).sum() + features.sum()).backward()
    records = prof.records
    root, encoder, fc, head = records[""], records["encoder"], records["encoder.fc"], records["head"]
    # Calls are the module's own: the root ran once, the encoder twice (one by itself).
    assert {name: record.calls for name, record in records.items()} == {name: reference[name] for name in records}
    assert (root.calls, encoder.calls, fc.calls, head.calls) == (1, 2, 2, 1)
    assert len(root.call_times) == 1 and len(encoder.call_times) == 2
    check_profile(prof, model)  # the root's times: its call plus the encoder's call by itself
    first = encoder.call_times[0]
    assert root.forward_ms == pytest.approx(root.call_times[0].forward_ms + first.forward_ms, abs=1e-9)
    assert root.backward_ms == pytest.approx(root.call_times[0].backward_ms + first.backward_ms, abs=1e-9)
    assert adopted_ms(root) == pytest.approx((first.forward_ms, first.backward_ms), abs=1e-9)
    # Self time is the module's own code: the root's call less its two sub-calls, whatever it adopted.
    own = root.call_times[0].forward_ms - encoder.call_times[1].forward_ms - head.call_times[0].forward_ms
    assert root.self_forward_ms == pytest.approx(own, abs=1e-9)
    # Every instant once: the self times add up to the root's inclusive time (they left out the call before).
    assert sum(r.self_forward_ms for r in records.values() if r.calls) == pytest.approx(root.forward_ms, abs=1e-6)
    # FLOPs, x [3, 4]: each encoder call 2*3*4*8 = 192 forward (its ReLU free); the head 2*3*8*2 = 96. Backward:
    # each fc call a weight gradient of 192 (x needs none), the head 96 + its input gradient 96.
    assert (fc.flops_forward, encoder.flops_forward, head.flops_forward) == (384, 384, 96)
    assert root.flops_forward == 384 + 96 == 480  # the encoder's call by itself included (288 left it out)
    assert (encoder.flops_backward, head.flops_backward, root.flops_backward) == (384, 192, 576)
    assert root.self_flops == 0 and encoder.self_flops == 0 and fc.self_flops == 384 + 384
    # Memory: each encoder call returns 3*8 floats = 96 bytes from fc and 96 from its ReLU: 192 a call; the head
    # 3*2*4 = 24. Saved for backward: fc saves x for its weight gradient, 3*4*4 = 48 bytes, and ReLU its output,
    # 96: 144 a call; the head's input is ReLU's output, saved already: 0.
    assert (encoder.activation_bytes, head.activation_bytes, root.activation_bytes) == (384, 24, 408)
    assert (encoder.saved_bytes, head.saved_bytes, root.saved_bytes) == (288, 0, 288)
    assert root.self_activation_bytes == 0 and root.self_saved_bytes == 0
    children_within(prof, ("forward_ms", "backward_ms", "flops_forward", "flops_backward", "activation_bytes",
                            "saved_bytes"))
    # Shares of the step: the root is 100 %, the encoder within it (it was 100 % + the call by itself).
    pytest.importorskip("pandas")
    frame = prof.to_dataframe(columns=["name", "time_percent"]).set_index("name")["time_percent"]
    assert frame[""] == pytest.approx(100.0) and (frame <= 100.0 + 1e-9).all()
    assert frame["encoder"] + frame["head"] <= 100.0 + 1e-9


def test_a_root_whose_forward_calls_the_encoder_by_itself() -> None:
    torch.manual_seed(0)
    wrapper, x = Wrapper(), torch.randn(3, 4)
    with torch.no_grad(), LayerProf(wrapper, metrics=("flops",)) as prof:
        wrapper(x)
    records = prof.records
    root, model, encoder = records[""], records["model"], records["model.encoder"]
    assert (root.calls, model.calls, encoder.calls) == (1, 1, 2)
    check_profile(prof, wrapper, backward=False)
    # The model adopts the encoder's call made by the root; the root made it, and holds it already.
    by_itself = encoder.call_times[0].forward_ms
    assert model.forward_ms == pytest.approx(model.call_times[0].forward_ms + by_itself, abs=1e-9)
    assert root.forward_ms == root.call_times[0].forward_ms
    # 2 encoder calls * 192 + the head's 96: 480 in the model (288 before), 480 in the root.
    assert (encoder.flops_forward, model.flops_forward, root.flops_forward) == (384, 480, 480)


def test_a_call_on_another_thread_inside_its_parents_call_is_not_counted_twice() -> None:
    class Threaded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: list[torch.Tensor] = []
            worker = threading.Thread(target=lambda: out.append(self.inner(x)))
            worker.start()
            worker.join()
            return out[0]

    net = Threaded()
    with torch.no_grad(), LayerProf(net) as prof:
        net(torch.randn(2, 4))
    root, inner = prof.tree, prof.records["inner"]
    # The thread's call has no parent on its thread, but the root's call was open: the root adopts nothing.
    assert inner.calls == 1 and root.forward_ms == root.call_times[0].forward_ms
    assert inner.forward_ms <= root.forward_ms


def test_a_container_never_called_adopts_nothing() -> None:
    net = nn.Sequential()
    net.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(x: torch.Tensor) -> torch.Tensor:
        for block in net.blocks:
            x = block(x)
        return x

    net.forward = forward  # type: ignore[method-assign]
    with LayerProf(net, metrics=("flops", "memory")) as prof:
        net(torch.randn(2, 4)).sum().backward()
    blocks = prof.records["blocks"]
    assert blocks.calls == 0 and blocks.forward_ms is None and blocks.backward_ms is None
    assert blocks.flops_forward is None and blocks.activation_bytes is None
    # The root called both blocks: 2 * (2*2*4*4) = 128 forward FLOPs, its time its own call's.
    assert prof.tree.flops_forward == 128 and prof.tree.forward_ms == prof.tree.call_times[0].forward_ms


def test_a_module_shared_by_two_parents_is_within_each() -> None:
    # One Linear under two names: its record is "a.fc" (the first), and b's calls of it are outside every call of
    # a: a adopts them. Each parent holds its child; the root's children overlap by b's calls.
    shared = nn.Linear(4, 4)
    net = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared))
    with torch.no_grad(), LayerProf(net, metrics=("flops",)) as prof:
        net(torch.randn(2, 4))
    records = prof.records
    first, second, fc = records["0"], records["1"], records["0.0"]
    assert fc.aliases == ["1.0"] and fc.calls == 2 and (first.calls, second.calls) == (1, 1)
    # 2*2*4*4 = 64 a call: the shared Linear ran twice, 128; the first Sequential ran one call and adopts the
    # other; the second holds the call made inside it; the root every op once.
    assert (fc.flops_forward, first.flops_forward, second.flops_forward, prof.tree.flops_forward) == (128, 128, 64,
                                                                                                      128)
    assert fc.forward_ms <= first.forward_ms + 1e-9
    assert first.forward_ms == pytest.approx(first.call_times[0].forward_ms + fc.call_times[1].forward_ms, abs=1e-9)


def test_profiles_saved_before_keep_their_figures() -> None:
    # A profile saved before ancestors adopted calls: the model left out the encoder's call, so its child was
    # above it. Its figures load as they were saved (nothing is recomputed from the call times), and render.
    rows = {
        "": {"name": "", "type": "Net", "depth": 0, "parent": None, "calls": 1, "forward_ms": 2.0,
             "backward_ms": None, "self_forward_ms": 0.5, "self_backward_ms": None, "steps": 1, "steps_run": 1,
             "aliases": [], "extra_repr": "", "call_times": [{"forward_start_ms": 5.0, "forward_ms": 2.0}]},
        "encoder": {"name": "encoder", "type": "Encoder", "depth": 1, "parent": "", "calls": 2, "forward_ms": 3.0,
                    "backward_ms": None, "self_forward_ms": 3.0, "self_backward_ms": None, "steps": 1,
                    "steps_run": 1, "aliases": [], "extra_repr": "",
                    "call_times": [{"forward_start_ms": 1.0, "forward_ms": 1.5},
                                   {"forward_start_ms": 5.1, "forward_ms": 1.5}]},
    }
    fresh = LayerProf(nn.Linear(1, 1))
    with fresh:
        fresh.model(torch.randn(1, 1))
    payload = json.loads(fresh.profile.to_json())
    payload["records"] = list(rows.values())
    loaded = layerprof.loads(json.dumps(payload))
    assert loaded.records[""].forward_ms == 2.0 and loaded.records["encoder"].forward_ms == 3.0
    assert "encoder" in loaded.layerwise_summary()
    assert pickle.loads(pickle.dumps(loaded)).records["encoder"].forward_ms == 3.0


def test_a_container_called_once_and_iterated_once_holds_both() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.body:              # the layers called by the root, the Sequential not running
                x = layer(x)
            return self.body(x)                  # then the Sequential called

    net = Net()
    with torch.no_grad(), LayerProf(net, metrics=("flops",)) as prof:
        net(torch.randn(2, 4))
    body, first = prof.records["body"], prof.records["body.0"]
    assert body.calls == 1 and first.calls == 2
    check_profile(prof, net, backward=False)
    # 2*2*4*4 = 64 FLOPs a Linear call, 4 calls: the Sequential holds all 256, its own call 128 of them.
    assert (first.flops_forward, body.flops_forward, prof.tree.flops_forward) == (128, 256, 256)
    iterated = prof.records["body.0"].call_times[0].forward_ms + prof.records["body.1"].call_times[0].forward_ms
    assert body.forward_ms == pytest.approx(body.call_times[0].forward_ms + iterated, abs=1e-9)
    assert body.self_forward_ms == pytest.approx(body.call_times[0].forward_ms - sum(
        prof.records[name].call_times[1].forward_ms for name in ("body.0", "body.1")), abs=1e-9)
