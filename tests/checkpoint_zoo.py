"""Real models for the checkpoint planner, at two scales: ``tiny`` for tests, ``bench`` for the benchmark.

Each entry builds (model, step) where ``step()`` runs one training step (forward and backward, gradients
zeroed first, RNG seeded) and returns (output, gradients). ``allow_side_effects``: the model has BatchNorm in
training, which the planner leaves out unless allowed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .models import scalar_loss


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[str], tuple[nn.Module, dict[str, Any]]]
    allow_side_effects: bool = False
    blocks: tuple[str, ...] = ()  # the containers of the natural repeated unit: their children are the blocks
    sequential: bool = False  # an nn.Sequential of blocks that checkpoint_sequential can run


def _tokens(vocab: int, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def _size(scale: str, tiny: int, bench: int) -> int:
    return tiny if scale == "tiny" else bench


def _resnet50(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    import torchvision

    side = _size(scale, 32, 96)
    return torchvision.models.resnet50(weights=None), {"x": torch.randn(2, 3, side, side)}


def _densenet(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    import torchvision

    side = _size(scale, 32, 64)
    return torchvision.models.densenet121(weights=None), {"x": torch.randn(2, 3, side, side)}


def _vit(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    config = transformers.ViTConfig(image_size=32, patch_size=4, hidden_size=_size(scale, 32, 128),
                                    num_hidden_layers=_size(scale, 2, 6), num_attention_heads=4,
                                    intermediate_size=_size(scale, 64, 512))
    return transformers.ViTModel(config, add_pooling_layer=False), {"pixel_values": torch.randn(2, 3, 32, 32)}


def _bert(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    config = transformers.BertConfig(vocab_size=200, hidden_size=_size(scale, 32, 128),
                                     num_hidden_layers=_size(scale, 2, 6), num_attention_heads=4,
                                     intermediate_size=_size(scale, 64, 512), max_position_embeddings=128)
    ids = _tokens(200, 2, _size(scale, 16, 128))
    return transformers.BertModel(config, add_pooling_layer=False), {"input_ids": ids,
                                                                     "attention_mask": torch.ones_like(ids)}


def _gpt2(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    config = transformers.GPT2Config(vocab_size=200, n_embd=_size(scale, 32, 128), n_layer=_size(scale, 2, 6),
                                     n_head=4, n_positions=128, use_cache=False)
    ids = _tokens(200, 2, _size(scale, 16, 128))
    return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}


def _t5(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    config = transformers.T5Config(vocab_size=200, d_model=_size(scale, 32, 128), d_kv=16,
                                   d_ff=_size(scale, 64, 512), num_layers=_size(scale, 1, 4), num_heads=4,
                                   decoder_start_token_id=0, use_cache=False)
    ids = _tokens(200, 2, _size(scale, 16, 96))
    return transformers.T5ForConditionalGeneration(config), {"input_ids": ids, "labels": ids}


def _albert(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    config = transformers.AlbertConfig(vocab_size=200, embedding_size=16, hidden_size=_size(scale, 32, 128),
                                       num_hidden_layers=_size(scale, 3, 6), num_attention_heads=4,
                                       intermediate_size=_size(scale, 64, 512), max_position_embeddings=128)
    ids = _tokens(200, 2, _size(scale, 16, 128))
    return transformers.AlbertModel(config, add_pooling_layer=False), {"input_ids": ids}


def _deep_mlp(scale: str) -> tuple[nn.Module, dict[str, Any]]:
    width = _size(scale, 64, 512)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.Tanh())
              for _ in range(8)]
    return nn.Sequential(nn.Linear(32, width), *blocks, nn.Linear(width, 8)), {"x": torch.randn(_size(scale, 16, 256), 32)}


ZOO = {
    "resnet50": ZooModel("resnet50", _resnet50, allow_side_effects=True,
                         blocks=("layer1", "layer2", "layer3", "layer4")),
    "densenet121": ZooModel("densenet121", _densenet, allow_side_effects=True,
                            blocks=tuple(f"features.denseblock{i}" for i in range(1, 5))),
    "vit": ZooModel("vit", _vit, blocks=("layers",)),
    "bert": ZooModel("bert", _bert, blocks=("encoder.layer",)),
    "gpt2": ZooModel("gpt2", _gpt2, blocks=("transformer.h",)),
    "t5": ZooModel("t5", _t5, blocks=("encoder.block", "decoder.block")),
    "albert": ZooModel("albert", _albert, blocks=("encoder.albert_layer_groups.0.albert_layers",)),
    "mlp": ZooModel("mlp", _deep_mlp, blocks=("",), sequential=True),
}


def zoo_step(name: str, scale: str = "tiny") -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, list[Any]]]]:
    """The model (in training mode, dropout on) and its repeatable training step."""
    torch.manual_seed(0)
    model, inputs = ZOO[name].build(scale)
    model.train()

    def step() -> tuple[torch.Tensor, list[Any]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        output = model(inputs["x"]) if set(inputs) == {"x"} else model(**inputs)
        loss = scalar_loss(output)
        loss.backward()
        return loss.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    return model, step
