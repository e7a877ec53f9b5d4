"""The outputs as a paper or a report takes them: LaTeX compiled by a real pdflatex, Markdown parsed by a real
renderer, CSV and JSON read back, plots saved as PDF. The checks that need a tool (pdflatex, pdftotext, a
Markdown parser) skip where it is missing; each has a pure-Python check beside it that catches the same bug."""
from __future__ import annotations

import re
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
from layerprof.render.export import latex_escape
from layerprof.render.table import Table
from layerprof.render.units import format_count, format_ms

PDFLATEX = shutil.which("pdflatex")
PDFTOTEXT = shutil.which("pdftotext")


# Names a user's model may have: LaTeX's and Markdown's special characters, Greek, accents, a long one.
ODD_NAMES = ["a_b", "x1_2", "cost$", "a$x_1$b", "pct%", "amp&", "hash#", "naïve_µ", "σ", "Δt", "tilde~", "caret^",
             "brace{}", "back\\slash", "pipe|", "lt<gt>", "tick`", "star*", "x" * 80]


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name in ODD_NAMES:
            self.add_module(name, nn.Linear(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for child in self.children():
            x = child(x)
        return x


@pytest.fixture(scope="module")
def small_profile() -> layerprof.Profile:
    """FLOPs, bytes (the roofline, with given peaks) and memory (the checkpoint frontier): every plot kind."""
    torch.manual_seed(0)
    model = Odd()
    with layerprof.LayerProf(model, metrics=("params", "flops", "memory"),
                             peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
        for _ in range(2):
            model(torch.randn(4, 16)).sum().backward()
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



def _pdflatex(tmp_path: Path, table: str, packages: str = "booktabs", preamble: str = "") -> Path:
    """``table`` compiled by pdflatex in a minimal article; the PDF. A LaTeX error fails the test with its lines."""
    if PDFLATEX is None:
        pytest.skip("pdflatex (texlive-latex-base) is not installed")
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "table.tex").write_text(table, encoding="utf-8")
    document = (f"\\documentclass{{article}}\n\\usepackage{{{packages}}}\n{preamble}\\begin{{document}}\n"
                "\\input{table.tex}\n\\end{document}\n")
    (tmp_path / "doc.tex").write_text(document, encoding="utf-8")
    for _ in range(2):  # (a longtable settles its column widths on the second run)
        done = subprocess.run([PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    log = (tmp_path / "doc.log").read_text(encoding="utf-8", errors="replace")
    errors = [line for line in log.splitlines() if line.startswith("!")]
    assert done.returncode == 0 and not errors, "\n".join(errors) or done.stdout[-2000:]
    return tmp_path / "doc.pdf"


def _overfull(pdf: Path) -> list[str]:
    return [line for line in pdf.with_suffix(".log").read_text(errors="replace").splitlines() if "Overfull" in line]


def test_latex_writes_greek_letters_and_backticks_as_any_engine_prints_them() -> None:
    # pdflatex stops at a Greek letter ("Unicode character σ (U+03C3) not set up for use with LaTeX"), and prints
    # a backtick as an opening quote: math and a command print them in any engine.
    assert latex_escape("σ_1 Δt Ωµ ο tick`") == (
        r"$\sigma$\_1 $\Delta$t $\Omega$$\mu$ o tick\textasciigrave{}")
    table = Table([{"name": "λ", "type": "Linear"}], columns=("name", "type"))
    assert table.to_latex().splitlines()[4] == r"$\lambda$ & Linear \\"


def test_latex_of_odd_names_holds_only_characters_pdflatex_has(small_profile) -> None:
    text = small_profile.to_latex(fit=True)
    # Beyond ASCII, only a Latin letter with an accent (naïve), which LaTeX's UTF-8 input typesets in any font.
    assert {char for char in text if ord(char) > 127} == {"ï"}


def test_latex_of_odd_names_compiles_and_shows_the_profiles_numbers(small_profile, tmp_path) -> None:
    columns = ("name", "forward", "backward", "params")
    # T1 fonts, as most papers have: in the default OT1 an underscore is a drawn rule, absent from the PDF's text.
    pdf = _pdflatex(tmp_path, small_profile.to_latex(columns=columns, fit=True, caption="Odd: 50% & $5"),
                    "booktabs,graphicx,lmodern", "\\usepackage[T1]{fontenc}\n")
    assert _overfull(pdf) == []  # scaled to the line: the 80-character name would be 200pt too wide
    if PDFTOTEXT is None:
        pytest.skip("pdftotext (poppler-utils) is not installed: the PDF's text is not read back")
    text = _pdf_text(pdf).replace("\u03bc", "µ")  # (math mu reads back as the Greek letter)
    assert "Table 1: Odd: 50% & $5" in text
    readable = {"": "(root)", **{name: name for name in ODD_NAMES if name.isascii()}}  # as pdftotext reads them
    for name, record in small_profile.records.items():
        cells = f"{format_ms(record.forward_ms)} {format_ms(record.backward_ms)} {format_count(record.params)}"
        assert f"{readable.get(name, '')} {cells} ".lstrip() in text + " "  # each row: its name, times and params


def test_a_wide_table_fits_the_line_only_when_asked_and_a_narrow_one_is_not_enlarged(small_profile,
                                                                                      tmp_path) -> None:
    wide = small_profile.to_latex()
    assert _overfull(_pdflatex(tmp_path / "wide", wide))  # (the 80-character name and 8 columns)
    fitted = small_profile.to_latex(fit=True)
    assert fitted.startswith("\\sbox0{%\n\\begin{tabular}{")
    assert fitted.endswith("\\end{tabular}}%\n\\noindent\\ifdim\\wd0>\\linewidth\\resizebox{\\linewidth}{!}{\\usebox0}"
                           "\\else\\usebox0\\fi\n")
    assert _overfull(_pdflatex(tmp_path / "fitted", fitted, "booktabs,graphicx")) == []
    narrow = small_profile.to_latex(columns=("name", "params"), max_depth=0, fit=True)
    pdf = _pdflatex(tmp_path / "narrow", narrow, "booktabs,graphicx")
    if PDFTOTEXT is None:
        pytest.skip("pdftotext (poppler-utils) is not installed: the PDF's text is not read back")
    assert _pdf_text(pdf) == f"Name Params (root) {format_count(small_profile.tree.params)} 1"
    # Drawn at its own size, not blown up to the line's width: its words stand as tall as the page number's.
    words = subprocess.run([PDFTOTEXT, "-bbox", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    heights = [float(y1) - float(y0) for y0, y1 in re.findall(r'yMin="([\d.]+)" xMax="[\d.]+" yMax="([\d.]+)"', words)]
    assert len(heights) == 5 and max(heights) < 12  # (10pt type; scaled to the line it would be about 40pt)


def test_a_long_table_breaks_across_pages_with_its_header_on_each(tmp_path) -> None:
    rows = [{"name": f"blocks.{i}", "type": "Linear", "forward_ms": 0.001 * (i + 1)} for i in range(500)]
    table = Table(rows, columns=("name", "type", "forward_ms"))
    text = table.to_latex(longtable=True, caption="500 modules", label="tab:long")
    lines = text.splitlines()
    header = ["\\toprule", "Name & Type & Forward \\\\", "\\midrule"]
    assert lines[:10] == ["\\begin{longtable}{llr}", "\\caption{500 modules} \\label{tab:long} \\\\", *header,
                          "\\endfirsthead", *header, "\\endhead"]
    assert lines[10] == "blocks.0 & Linear & 1 $\\mu$s \\\\" and lines[-2:] == ["\\bottomrule", "\\end{longtable}"]
    assert len(lines) == 10 + 500 + 2
    with pytest.raises(ValueError, match="longtable=True and fit=True cannot go together"):
        table.to_latex(longtable=True, fit=True)
    pdf = _pdflatex(tmp_path, text, "booktabs,longtable")
    pages = int(re.search(r"Output written on doc\.pdf \((\d+) pages", pdf.with_suffix(".log").read_text()).group(1))
    assert pages >= 10 and _overfull(pdf) == []  # (a tabular of 500 rows runs off the first page's bottom)
    if PDFTOTEXT is not None:
        shown = _pdf_text(pdf)
        assert shown.count("Name Type Forward") == pages and "blocks.499 Linear 500 µs" in shown.replace("μ", "µ")


def test_a_label_without_a_caption_is_refused(small_profile) -> None:
    # LaTeX numbers a table by its caption: \ref of a label in a table without one gives the section's number.
    with pytest.raises(ValueError, match=r"label='tab:x' needs a caption: .* give caption= too"):
        small_profile.to_latex(label="tab:x")
    assert "\\caption{Costs}\n\\label{tab:x}" in small_profile.to_latex(caption="Costs", label="tab:x")


# -- a comparison of two profiles as a paper's table (teacher and student) -------------------------------------

def _mlp_profile(width: int) -> layerprof.Profile:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 10))
    with layerprof.LayerProf(net, metrics=("params", "flops")) as prof:
        net(torch.randn(4, 32)).sum().backward()
    return prof.profile


@pytest.fixture(scope="module")
def teacher_student() -> layerprof.render.compare.Comparison:
    return layerprof.compare(_mlp_profile(64), _mlp_profile(16), names=("teacher", "student"))


def test_a_comparison_writes_markdown_with_labelled_metrics_and_right_aligned_figures(teacher_student) -> None:
    lines = teacher_student.to_markdown().splitlines()
    assert lines[:2] == ["| Metric | teacher | student | Change | Ratio | Better |", "|:---|---:|---:|---:|---:|:---|"]
    assert len(lines) == 2 + len(teacher_student.model)
    # teacher 32*64+64 + 64*10+10 = 2,762 parameters; student 32*16+16 + 16*10+10 = 698; 698/2762 = 0.253
    assert "| Params | 2.76k | 698 | -74.7% | 0.253x | student |" in lines
    # forward FLOPs 2*4*(32*64 + 64*10) = 21,504 and 2*4*(32*16 + 16*10) = 5,376: a quarter
    assert "| FLOPs forward | 21.5 kFLOPs | 5.38 kFLOPs | -75.0% | 0.25x | student |" in lines
    raw = teacher_student.to_markdown(raw=True).splitlines()
    assert raw[0] == "| metric | teacher | student | diff | rel_diff | ratio | better |"
    assert "| params | 2762 | 698 | -2064 | -0.7472845763939174 | 0.25271542360608257 | student |" in raw


def test_a_comparison_of_modules_lists_the_largest_change_first(teacher_student, tmp_path) -> None:
    text = teacher_student.to_csv(tmp_path / "modules.csv", level="modules", field="params")
    # 0: 32*64+64 = 2,112 against 32*16+16 = 528; 2: 64*10+10 = 650 against 16*10+10 = 170; 1 (ReLU): none
    assert text.splitlines() == ["module,teacher,student,diff,ratio", "0,2112,528,-1584,0.25",
                                 "2,650,170,-480,0.26153846153846155", "1,0,0,0,"]
    assert (tmp_path / "modules.csv").read_text() == text
    top = teacher_student.to_markdown(level="modules", field="flops_forward", limit=1).splitlines()
    assert top == ["| Module | teacher | student | Diff | Ratio |", "|:---|---:|---:|---:|---:|",
                   "| 0 | 16.4 kFLOPs | 4.1 kFLOPs | -12.3 kFLOPs | 0.25x |"]  # 2*4*32*64 = 16,384; 2*4*32*16 = 4,096
    model = teacher_student.to_csv().splitlines()
    assert model[0] == "metric,teacher,student,diff,rel_diff,ratio,better"
    assert "params,2762,698,-2064,-0.7472845763939174,0.25271542360608257,student" in model


def test_a_comparison_as_latex_compiles_with_its_numbers(teacher_student, tmp_path) -> None:
    text = teacher_student.to_latex(caption="Teacher and student", label="tab:ts")
    lines = text.splitlines()
    assert lines[:6] == ["\\begin{table}", "\\centering", "\\caption{Teacher and student}", "\\label{tab:ts}",
                         "\\begin{tabular}{lrrrrl}", "\\toprule"]
    assert "Params & 2.76k & 698 & -74.7\\% & 0.253x & student \\\\" in lines
    pdf = _pdflatex(tmp_path, text)
    if PDFTOTEXT is not None:
        assert "Params 2.76k 698 -74.7% 0.253x student" in _pdf_text(pdf)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"level": "layers"}, ValueError, "level must be 'model' or 'modules', got 'layers'"),
    ({"field": "params"}, ValueError, "field= and limit= choose among the modules: give level='modules'"),
    ({"level": "modules", "field": "saved_bytes"}, ValueError,
     r"field: 'saved_bytes' is not among the fields this comparison holds per module \(forward_ms, "),
    ({"level": "modules", "limit": 0}, ValueError, "limit must be a whole number of rows >= 1"),
    ({"path": ["metric"]}, TypeError, "path must be a file path"),
    ({"raw": "yes"}, TypeError, "raw"),
])
def test_a_comparison_table_refuses_what_it_cannot_write(teacher_student, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        teacher_student.to_markdown(**kwargs)


def test_profiles_named_as_a_tables_column_in_any_case_are_refused() -> None:
    profile = _mlp_profile(16)
    with pytest.raises(ValueError, match="names: 'Change' is a column of the comparison's tables"):
        layerprof.compare(profile, profile, names=("Change", "b"))


def test_the_command_line_writes_the_comparison_tables_or_none(tmp_path, capsys) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _mlp_profile(64).to_json(a)
    _mlp_profile(16).to_json(b)
    paths = {flag: tmp_path / f"c.{suffix}" for flag, suffix in (("csv", "csv"), ("markdown", "md"), ("latex", "tex"))}
    # A path that cannot be written is refused before anything is read or written.
    unwritable = str(tmp_path / "no" / "c.tex")
    assert main(["compare", str(a), str(b), "--csv", str(paths["csv"]), "--latex", unwritable]) == 2
    assert "--latex" in capsys.readouterr().err and not paths["csv"].exists()
    argv = ["compare", str(a), str(b)] + [item for flag, path in paths.items() for item in (f"--{flag}", str(path))]
    assert main(argv) == 0
    assert "| Params | 2.76k | 698 | -74.7% | 0.253x | B |" in paths["markdown"].read_text()
    assert "params,2762,698,-2064," in paths["csv"].read_text()
    assert "Params & 2.76k & 698 & -74.7\\% & 0.253x & B \\\\" in paths["latex"].read_text()
