"""Real models: torchvision CNNs (in-place ReLU, residual adds), Hugging Face transformers built from configs
(keyword inputs, dataclass outputs, tied and shared embeddings), an LSTM."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import hook_state
from .models import scalar_loss
from .invariants import check_profile, check_truth, count_calls, parameter_modules_have_backward
from .measured import measured_until

torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")


def _tokens(vocab: int, batch: int = 2, length: int = 16) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def _bert() -> tuple[nn.Module, dict[str, Any]]:
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    ids = _tokens(100)
    return transformers.BertModel(config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _gpt2() -> tuple[nn.Module, dict[str, Any]]:
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    ids = _tokens(100)
    return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}


def hf_checkpoints_layer_call() -> bool:
    """Whether transformers' ``GradientCheckpointingLayer`` checkpoints the layer's ``__call__`` (5.17: the layer's
    hooks run again in backward, and the checkpoint, called from the layer's parent, keeps the layer's input
    there) rather than its ``forward`` (5.24: the hooks run once, and the layer keeps its input)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return "__call__" in vars(GradientCheckpointingLayer)


def _t5() -> tuple[nn.Module, dict[str, Any]]:
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                                   decoder_start_token_id=0)
    ids = _tokens(100)
    return transformers.T5ForConditionalGeneration(config), {"input_ids": ids, "labels": ids}


def _lstm() -> tuple[nn.Module, dict[str, Any]]:
    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(64, 5)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(self.embed(ids))[0])

    return Tagger(), {"ids": _tokens(50)}


def _vision(factory: Callable[..., nn.Module], size: int = 64) -> Callable[[], tuple[nn.Module, dict[str, Any]]]:
    return lambda: (factory(weights=None), {"x": torch.randn(2, 3, size, size)})


ZOO = {
    "resnet18": _vision(torchvision.models.resnet18),
    "mobilenet_v3_small": _vision(torchvision.models.mobilenet_v3_small),
    "densenet121": _vision(torchvision.models.densenet121, 32),
    "bert": _bert,
    "gpt2": _gpt2,
    "t5": _t5,
    "lstm": _lstm,
}


def _call(model: nn.Module, inputs: dict[str, Any]) -> Any:
    if set(inputs) == {"x"}:
        return model(inputs["x"])
    return model(**inputs)


def zoo_step(name: str) -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, list[torch.Tensor | None]]]]:
    """A zoo model and a training step returning its loss and gradients, repeatable bitwise."""
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    model.train()
    if name in ("bert", "gpt2", "t5"):
        model.eval()  # no dropout, so two runs are comparable bitwise

    def step() -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = scalar_loss(_call(model, inputs))
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    return model, step


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_profile_is_complete_correct_and_clean(name: str) -> None:
    model, step = zoo_step(name)

    before_hooks, before_repr = hook_state(model), repr(model)
    plain_loss, plain_grads = step()
    with count_calls(model) as reference, LayerProf(model) as prof:
        prof_loss, prof_grads = step()

    # Bitwise identical outputs and gradients; nothing left on the model.
    assert torch.equal(plain_loss, prof_loss)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(plain_grads, prof_grads))
    assert hook_state(model) == before_hooks and repr(model) == before_repr

    check_profile(prof, model)
    check_truth(prof, model, reference=reference)
    # Every module that ran is present with the exact number of calls.
    for module_name, record in prof.records.items():
        assert record.calls == reference[module_name], module_name
    ran = [r for r in prof.records.values() if r.calls]
    assert len(ran) >= 0.9 * len(prof.records) or name == "t5"
    # Modules with parameters that took part in the loss got a real backward time.
    parameter_modules_have_backward(prof, model)


def test_first_layer_and_root_backward_are_real_on_resnet() -> None:
    model = torchvision.models.resnet18(weights=None)

    def measure() -> tuple[Any, Any]:
        with LayerProf(model) as prof:
            model(torch.randn(1, 3, 64, 64)).sum().backward()
        return prof.records["conv1"], prof.tree

    def real(found: tuple[Any, Any]) -> bool:
        conv1, root = found
        return conv1.backward_ms > 0.05 * conv1.forward_ms and root.backward_ms > 0.5 * root.forward_ms

    # conv1's input needs no grad: a backward hook counter reads ~0 here; its weight gradient is real work. conv1's
    # forward is a fraction of a ms: a preemption inside it (a loaded machine) outweighs its backward in that
    # attempt only, so the measurement is retried; a backward read as ~0 fails every attempt.
    conv1, root = measured_until(3, measure, real)
    assert conv1.backward_ms > 0.05 * conv1.forward_ms, (conv1.backward_ms, conv1.forward_ms)
    assert root.backward_ms > 0.5 * root.forward_ms, (root.backward_ms, root.forward_ms)


def test_module_registered_under_two_names_is_one_record_with_aliases() -> None:
    class Seq2Seq(nn.Module):  # T5-style: one embedding module owned by the model, used by both halves
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Embedding(50, 16)
            self.encoder = nn.Sequential(self.shared, nn.Linear(16, 16))
            self.decoder = nn.Sequential(self.shared, nn.Linear(16, 16))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.encoder(ids) + self.decoder(ids)

    model = Seq2Seq()
    with LayerProf(model) as prof:
        model(_tokens(50)).sum().backward()
    shared = prof.records["shared"]
    assert shared.aliases == ["encoder.0", "decoder.0"]
    assert "encoder.0" not in prof.records
    assert shared.calls == 2 and len(shared.call_times) == 2
    assert all(t.backward_ms is not None and t.backward_ms > 0 for t in shared.call_times)
    summary = prof.layerwise_summary()
    assert "(0): Embedding【same module as 'shared', counted there】()" in summary
    assert "2 calls" in summary.split("\n")[2]
