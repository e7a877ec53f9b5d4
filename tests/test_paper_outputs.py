"""The outputs as a paper or a report takes them: LaTeX compiled by a real pdflatex, Markdown parsed by a real
renderer, CSV and JSON read back, plots saved as PDF. The checks that need a tool (pdflatex, pdftotext, a
Markdown parser) skip where it is missing; each has a pure-Python check beside it that catches the same bug."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

import layerprof
from layerprof.cli import main

PDFTOTEXT = shutil.which("pdftotext")


@pytest.fixture(scope="module")
def small_profile() -> layerprof.Profile:
    """FLOPs, bytes (the roofline, with given peaks) and memory (the checkpoint frontier): every plot kind."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(3)], nn.Linear(32, 1))
    with layerprof.LayerProf(model, metrics=("flops", "memory"), peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
        for _ in range(2):
            model(torch.randn(16, 32)).sum().backward()
            prof.step()
    return prof.profile


def _pdf_text(path: Path) -> str:
    done = subprocess.run([PDFTOTEXT, "-layout", str(path), "-"], capture_output=True, text=True, check=True)
    return " ".join(done.stdout.split())


@pytest.mark.parametrize("kind", ["sunburst", "icicle", "top", "roofline", "checkpoint"])
def test_a_plot_saves_as_a_pdf_with_truetype_fonts(small_profile, tmp_path, kind) -> None:
    path = tmp_path / f"{kind}.pdf"
    before = matplotlib.rcParams["pdf.fonttype"]
    ax = small_profile.plot(kind, path=path)
    data = path.read_bytes()
    assert data.startswith(b"%PDF-")
    # Type 3 fonts (matplotlib's default) are what publishers' checks refuse; TrueType is embedded as /FontFile2.
    assert b"/Type3" not in data and b"/FontFile2" in data
    assert matplotlib.rcParams["pdf.fonttype"] == before  # the user's settings are left as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{kind}.pdf"]
    if PDFTOTEXT is None:
        pytest.skip("pdftotext (poppler-utils) is not installed: the PDF's text is not read back")
    assert " ".join(ax.get_title().split()) in _pdf_text(path)  # e.g. "total 412 µs": the µ glyph is there


def test_a_pdf_plot_leaves_the_callers_figure_open(small_profile, tmp_path) -> None:
    figure, ax = plt.subplots()
    try:
        assert small_profile.plot("top", ax=ax, path=tmp_path / "mine.pdf") is ax
        assert figure.number in plt.get_fignums()
        assert (tmp_path / "mine.pdf").read_bytes().startswith(b"%PDF-")
    finally:
        plt.close(figure)


def test_the_command_line_saves_a_pdf_plot(tmp_path, capsys) -> None:
    path = tmp_path / "linear.pdf"
    argv = ["torch.nn:Linear", "--kwargs", '{"in_features": 8, "out_features": 4}', "-i", "2,8", "--steps", "1",
            "--warmup", "0", "--plot", str(path), "--plot-kind", "top"]
    assert main(argv) == 0, capsys.readouterr().err
    data = path.read_bytes()
    assert data.startswith(b"%PDF-") and b"/Type3" not in data
