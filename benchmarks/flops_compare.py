"""Total FLOPs of one forward (and forward+backward) by layerprof beside other counters, on the same models.

    python benchmarks/flops_compare.py [--markdown]

Every figure is in GFLOPs with 1 MAC = 2 FLOPs: tools that report MACs (fvcore, ptflops, thop, torchinfo's
mult-adds, DeepSpeed's ``macs``) are doubled. Each tool runs as its documentation shows (thop, ptflops and
torchinfo run the model under ``no_grad``), on a model in eval mode, batch 1, one thread. Missing tools are
reported as such; a tool that raises on a model shows ``error``.
"""
from __future__ import annotations

import argparse
import copy
import contextlib
import io
import warnings
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from layerprof import LayerProf

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


class TensorOut(nn.Module):
    """Wraps an HF model so that hook-based tools get a tensor in and a tensor out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


class LSTMModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True)
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def models() -> list[tuple[str, nn.Module, torch.Tensor]]:
    import torchvision
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    image = torch.randn(1, 3, 224, 224)
    ids = torch.randint(0, 1000, (1, 128))
    bert = BertModel(BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                                vocab_size=1000, max_position_embeddings=128))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=1000, n_positions=128))
    return [
        ("resnet18 1x3x224x224", torchvision.models.resnet18(weights=None), image),
        ("mobilenet_v3_small 1x3x224x224", torchvision.models.mobilenet_v3_small(weights=None), image),
        ("vit_b_16 1x3x224x224", torchvision.models.vit_b_16(weights=None), image),
        ("BERT 4x256, seq 128", TensorOut(bert), ids),
        ("GPT-2 4x256, seq 128", TensorOut(gpt2), ids),
        ("LSTM 2x256, 1x64x128", LSTMModel(), torch.randn(1, 64, 128)),
    ]


# -- one function per tool: (model, input) -> forward GFLOPs --------------------------------------------------
def layerprof_flops(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    with LayerProf(model, metrics=("flops",)) as prof:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    return prof.tree.flops_forward / 1e9, (prof.tree.flops_forward + prof.tree.flops_backward) / 1e9


def flop_counter_mode(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        forward = counter.get_total_flops()
        out.sum().backward()
    model.zero_grad(set_to_none=True)
    return forward / 1e9, counter.get_total_flops() / 1e9


def fvcore_flops(model: nn.Module, x: torch.Tensor) -> float:
    from fvcore.nn import FlopCountAnalysis

    analysis = FlopCountAnalysis(model, x)
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return 2 * analysis.total() / 1e9  # fvcore counts one "flop" per MAC


def ptflops_flops(model: nn.Module, x: torch.Tensor) -> float:
    from ptflops import get_model_complexity_info

    with contextlib.redirect_stdout(io.StringIO()):
        macs, _ = get_model_complexity_info(copy.deepcopy(model), tuple(x.shape[1:]), as_strings=False,
                                            print_per_layer_stat=False, input_constructor=lambda _: {"x": x}
                                            if not isinstance(model, TensorOut) else {"input_ids": x})
    return 2 * macs / 1e9


def thop_flops(model: nn.Module, x: torch.Tensor) -> float:
    from thop import profile

    with contextlib.redirect_stdout(io.StringIO()):
        macs, _ = profile(copy.deepcopy(model), inputs=(x,), verbose=False)
    return 2 * macs / 1e9


def torchinfo_flops(model: nn.Module, x: torch.Tensor) -> float:
    from torchinfo import summary

    return 2 * summary(model, input_data=[x], verbose=0).total_mult_adds / 1e9


def deepspeed_flops(model: nn.Module, x: torch.Tensor) -> float:
    from deepspeed.profiling.flops_profiler import get_model_profile

    with contextlib.redirect_stdout(io.StringIO()):
        flops, macs, _ = get_model_profile(model, args=[x], print_profile=False, detailed=False, as_string=False)
    return 2 * macs / 1e9  # its ``flops`` adds elementwise ops; its ``macs`` are the comparable figure


TOOLS: list[tuple[str, Callable[[nn.Module, torch.Tensor], float]]] = [
    ("fvcore", fvcore_flops), ("ptflops", ptflops_flops), ("thop", thop_flops),
    ("torchinfo", torchinfo_flops), ("DeepSpeed", deepspeed_flops),
]


def measure(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    model.eval()
    row: dict[str, Any] = {}
    row["layerprof fwd"], row["layerprof fwd+bwd"] = layerprof_flops(model, x)
    row["FlopCounterMode fwd"], row["FlopCounterMode fwd+bwd"] = flop_counter_mode(model, x)
    for name, tool in TOOLS:
        try:
            row[name] = tool(model, x)
        except ImportError:
            row[name] = "not installed"
        except Exception as error:  # a tool that cannot handle a model is a result too
            row[name] = f"error: {type(error).__name__}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args()
    columns = ["layerprof fwd", "layerprof fwd+bwd", "FlopCounterMode fwd", "FlopCounterMode fwd+bwd",
               *[name for name, _ in TOOLS]]
    print("| model | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for label, model, x in models():
        row = measure(model, x)
        cells = [f"{value:.3f}" if isinstance(value, float) else str(value) for value in (row[c] for c in columns)]
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
