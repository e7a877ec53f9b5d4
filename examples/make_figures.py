"""Profile ResNet-50 and a small BERT on the CPU and write the README's figures to ``figures/``.

    python examples/make_figures.py [--out figures]

Needs torchvision and transformers (``pip install torchvision transformers``); no weights are downloaded.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402

import layerprof  # noqa: E402


def train_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    output = model(**inputs)
    logits = output if isinstance(output, torch.Tensor) else output.logits
    logits.float().sum().backward()


def profile(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> layerprof.Profile:
    """One warm-up step (allocator, kernels' first-call costs), then one profiled training step."""
    model.train()
    train_step(model, inputs)
    model.zero_grad(set_to_none=True)
    with layerprof.LayerProf(model) as prof:
        train_step(model, inputs)
    return prof.profile


def resnet50() -> layerprof.Profile:
    from torchvision.models import resnet50 as build

    return profile(build(weights=None), {"x": torch.randn(1, 3, 224, 224)})


def small_bert() -> layerprof.Profile:
    try:
        from transformers import BertConfig, BertForSequenceClassification
    except ImportError as error:  # pragma: no cover - an example's dependency
        raise SystemExit("this example needs transformers: pip install transformers") from error

    config = BertConfig(
        vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        max_position_embeddings=256, num_labels=2,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    ids = torch.randint(0, config.vocab_size, (4, 128))
    return profile(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("figures"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name, make in (("resnet50", resnet50), ("bert", small_bert)):
        prof = make()
        print(prof)
        prof.plot("sunburst", path=args.out / f"{name}_sunburst.png")
        prof.plot("icicle", path=args.out / f"{name}_icicle.png")
        prof.plot("top", k=12, path=args.out / f"{name}_top.png")
        prof.plot("top", k=10, by_type=True, path=args.out / f"{name}_top_types.png")
    for path in sorted(args.out.glob("*.png")):
        print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
