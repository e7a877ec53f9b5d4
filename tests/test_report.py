"""The interactive report: its data, and the page itself in headless Chromium (skipped where none is installed)."""
from __future__ import annotations

import functools
import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.render.report import report_data, script_json

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


def _profile() -> LayerProf:
    net = nn.Sequential(nn.Linear(4, 16), nn.Sequential(nn.Linear(16, 16), nn.GELU()), nn.Linear(16, 2))
    with LayerProf(net, metrics=("params", "flops")) as prof:
        for _ in range(3):
            net(torch.randn(8, 4)).sum().backward()
            prof.step()
    return prof


def test_report_data_has_every_module_metric_and_the_last_step() -> None:
    prof = _profile()
    data = report_data(prof.profile.tree, prof.profile.meta)
    assert [m["name"] for m in data["metrics"]] == ["forward_ms", "backward_ms", "total_ms", "flops", "params"]
    assert [n["name"] for n in data["nodes"]] == ["", "0", "1", "1.0", "1.1", "2"]
    assert data["nodes"][3]["parent"] == 2 and data["nodes"][3]["values"]["params"] == 16 * 16 + 16
    # Linear(16, 16) on 8 rows: forward 2*8*16*16 = 4096 FLOPs, backward twice that (input and weight grads).
    assert data["nodes"][3]["values"]["flops"] == 3 * 4096
    assert data["nodes"][3]["shown"]["params"] == "272"
    timeline = data["timeline"]
    assert timeline["step"] == 2 and {s["phase"] for s in timeline["slices"]} == {"forward", "backward"}
    assert sum(s["phase"] == "forward" for s in timeline["slices"]) == 6  # one call per module in the step
    assert min(s["start"] for s in timeline["slices"]) == 0.0


def test_report_is_self_contained() -> None:
    page = _profile().to_report()
    assert "<script src" not in page and "<link" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")
    assert "https://" not in page


def run_chromium(url: str, profile_dir: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile_dir}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *extra, url],
        capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium); "
                                             ".ci/run installs it so CI runs this test")
def test_report_in_headless_chromium(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    _profile().to_report(path)
    with tempfile.TemporaryDirectory() as profile_dir:
        result = run_chromium(path.as_uri() + "#selftest", profile_dir, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []  # the page logs nothing: any console line is an error or a warning
    dom = result.stdout
    found = re.search(r'<pre id="selftest">(.*?)</pre>', dom)
    assert found, "the page's self-test did not run (a script error stopped it)"
    check = json.loads(html.unescape(found.group(1)))
    assert check["names"] == ["", "0", "1", "1.0", "1.1", "2"]  # the SVG holds a cell per module
    assert check["zoomedTo"] == "0" and check["cellsAfterZoom"] == 1  # a click on Linear "0" zoomed to it
    assert [m for m, _ in check["metrics"]] == ["forward_ms", "backward_ms", "total_ms", "flops", "params"]
    assert check["rows"] == 6 and check["sortedFirst"] == "Sequential"  # sorted by forward time: the root first
    assert check["filtered"] == 3  # "linear" matches the three Linear modules by type
    assert check["tooltip"].startswith("Sequential Sequential") and "Forward Time" in check["tooltip"]
    assert "<title>0</title>" in dom  # the zoomed icicle, in the final DOM
    assert dom.count('<td class="type">Linear</td>') == 3  # the filtered table
    # The timeline's caption names the step as the header counts them (it showed the step's index among every step
    # run, warm-up and counting steps included: "1 profiled step" beside "step 2").
    assert '<span id="timeline-caption">(the last profiled step, one row per depth)</span>' in dom


def selftest(page: str, tmp_path: Path) -> tuple[dict, str]:
    """Open ``page`` in headless Chromium with #selftest; the page's own check as a dict, and the final DOM."""
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile_dir:
        result = run_chromium(path.as_uri() + "#selftest", profile_dir, "--dump-dom", "--window-size=1200,900")
    assert result.returncode == 0, result.stderr[-2000:]
    assert [line for line in result.stderr.splitlines() if ":CONSOLE" in line] == []
    found = re.search(r'<pre id="selftest">(.*?)</pre>', result.stdout, re.S)
    assert found, "the page's self-test did not run: the page is blank or a script error stopped it"
    return json.loads(html.unescape(found.group(1))), result.stdout


@functools.cache
def _transformer(which: str) -> LayerProf:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if which == "bert":
        model = transformers.BertModel(transformers.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32))
    else:
        model = transformers.GPT2Model(transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2,
                                                               n_positions=16))
    with LayerProf(model) as prof:
        for _ in range(2):
            model(input_ids=torch.randint(0, 50, (2, 8)))[0].sum().backward()
            prof.step()
    return prof


def _rows_used(slices: list[dict]) -> dict[str, list[int]]:
    return {phase: sorted({s["depth"] for s in slices if s["phase"] == phase}) for phase in ("forward", "backward")}


@pytest.mark.parametrize("which,layers", [("bert", "encoder.layer"), ("gpt2", "h")])
def test_report_timeline_has_no_row_for_a_container_never_called(which: str, layers: str) -> None:
    data = report_data(_transformer(which).profile.tree)
    slices = data["timeline"]["slices"]
    # A row per depth a reader counts: every row from 0 to the deepest holds slices (the ModuleList's used to be
    # empty), and a layer sits one row below its parent's parent.
    for phase, rows in _rows_used(slices).items():
        assert rows == list(range(len(rows))), phase
    depth = {s["name"]: s["depth"] for s in slices}
    parent = layers.rpartition(".")[0] or data["nodes"][0]["type"]
    assert depth[f"{layers}.0"] == depth[f"{layers}.1"] == depth[parent] + 1


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")
@pytest.mark.parametrize("which,layers", [("bert", "encoder.layer"), ("gpt2", "h")])
def test_report_icicle_reaches_transformer_layers_in_chromium(which: str, layers: str, tmp_path: Path) -> None:
    prof = _transformer(which)
    check, _ = selftest(prof.to_report(), tmp_path)
    cells = check["names"]
    # The ModuleList is drawn as the sum of its layers (dashed), and the layers and what is inside them are drawn.
    assert check["summed"] == [layers]
    assert {layers, f"{layers}.0", f"{layers}.1"} <= set(cells)
    inside = f"{layers}.0.attention" if which == "bert" else f"{layers}.0.attn"
    assert inside in cells
    assert [m for m, n in check["metrics"]] == ["forward_ms", "backward_ms", "total_ms", "params"]
    assert check["slices"] > 0 and check["rows"] == len(prof.records)


HOSTILE = ["<!--<script>", "</script><script>alert(1)</script>", "\"quoted\" 'single'",
           "&amp;&lt;", "ünïcødé→🚀", "line\u2028break\u2029", "x" * 3000, "<b>bold</b>"]


class Hostile(nn.Module):
    """Modules under names that are legal ModuleDict keys and hostile to HTML and JSON, and a list of 1,500 small
    layers: far more than the page is wide."""

    def __init__(self) -> None:
        super().__init__()
        self.named = nn.ModuleDict({name: nn.Linear(4, 4) for name in HOSTILE})
        self.many = nn.ModuleList(nn.Linear(4, 4) for _ in range(1500))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.named.values():
            x = layer(x)
        return x + sum(layer(x) for layer in self.many)


@pytest.fixture(scope="module")
def hostile() -> LayerProf:
    torch.manual_seed(0)
    model = Hostile()
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    return prof


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")
def test_report_with_hostile_names_and_sub_pixel_cells_in_chromium(hostile: LayerProf, tmp_path: Path) -> None:
    page = hostile.to_report()
    assert "<!--" not in page.split('id="layerprof-data">')[1].split("</script>")[0]  # nothing the parser reads
    check, dom = selftest(page, tmp_path)
    # each hostile name comes back exactly as it was, as text (no element was made from it)
    assert check["tableNames"][:10] == ["Hostile", "named", *(f"named.{name}" for name in HOSTILE)]
    # no element came from a name: the page holds only the kinds of element it builds (<b> would be the name's)
    assert check["elements"] == sorted(["button", "div", "g", "h1", "h2", "header", "input", "label",
                                        "option", "rect", "script", "section", "select", "span", "svg", "table",
                                        "tbody", "td", "text", "th", "thead", "title", "tr"])
    # 1,500 layers on 1,200 pixels: those under a pixel are drawn as an "other" cell under "many", none dropped
    under_many = sum(count for parent, count in check["others"] if parent == "many")
    assert under_many > 0 and under_many + sum(name.startswith("many.") for name in check["names"]) == 1500
    modules = len(hostile.records)  # 1 + 1 + 8 + 1 + 1500
    assert modules == 1511 and check["rows"] == 200  # the table shows its first page of rows ...
    # ... and, filtered to the 1,508 Linear layers at the end of the self-test, says how many more there are
    assert check["filtered"] == 200 and "show 200 more (1308 left)" in dom and "1508 of 1511 modules" in dom


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")
def test_hostile_names_in_html_table_trace_and_speedscope_in_chromium(hostile: LayerProf, tmp_path: Path) -> None:
    table = tmp_path / "table.html"
    hostile.to_html(table, name="named*")
    # The trace and speedscope files, read by Chromium's own JSON parser from a page that holds their text.
    files = {"trace": hostile.to_trace(), "speedscope": hostile.to_speedscope()}
    reader = tmp_path / "reader.html"
    reader.write_text(
        "<!DOCTYPE html><meta charset=utf-8><body><script>\nconst files = " + script_json(files) + ";\n"
        "const out = {};\nfor (const k in files) { const d = JSON.parse(files[k]);\n"
        "  out[k] = k === 'trace' ? d.traceEvents.filter((e) => e.ph === 'X').map((e) => e.args.module)\n"
        "                         : d.shared.frames.map((f) => f.name); }\n"
        "const pre = document.createElement('pre'); pre.id = 'out'; pre.textContent = JSON.stringify(out);\n"
        "document.body.appendChild(pre);\n</script>", encoding="utf-8")
    found = {}
    for path in (table, reader):
        with tempfile.TemporaryDirectory() as profile_dir:
            result = run_chromium(path.as_uri(), profile_dir, "--dump-dom")
        assert result.returncode == 0, result.stderr[-2000:]
        found[path.name] = result.stdout
    cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", found["table.html"], re.S)]
    for name in HOSTILE:
        assert f"named.{name}" in cells  # the cell's text is the name, whole
    out = json.loads(html.unescape(re.search(r'<pre id="out">(.*?)</pre>', found["reader.html"], re.S).group(1)))
    for name in HOSTILE:
        assert f"named.{name}" in out["trace"] and f"named.{name} (Linear)" in out["speedscope"]
