"""Profile ResNet-50 and a small BERT on the CPU and draw the README's sunburst, icicle and top figures.

    python examples/make_figures.py                 # into a new temporary folder (printed), the clone untouched
    python examples/make_figures.py --out DIR       # into DIR
    python examples/make_figures.py --out figures   # refresh the figures tracked in the repository

The PNGs are not byte-stable (timings differ from run to run), so the default writes outside the repository:
a run leaves ``figures/`` and ``git status`` clean unless asked with ``--out figures``.
Needs torchvision and transformers (``pip install torchvision transformers``); no weights are downloaded.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Sequence

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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:5]))
    parser.add_argument("--out", type=Path, default=None,
                        help="the folder to write into (default: a new temporary folder; 'figures' refreshes the "
                             "repository's figures)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="layerprof-figures-"))
    return args


def write_figures(prof: layerprof.Profile, name: str, out: Path) -> list[Path]:
    """The four figures of one model, ``<name>_<kind>.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}_{kind}.png" for kind in ("sunburst", "icicle", "top", "top_types")]
    prof.plot("sunburst", path=paths[0])
    prof.plot("icicle", path=paths[1])
    prof.plot("top", k=12, path=paths[2])
    prof.plot("top", k=10, by_type=True, path=paths[3])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name, make in (("resnet50", resnet50), ("bert", small_bert)):
        prof = make()
        print(prof)
        for path in write_figures(prof, name, args.out):
            print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
