"""The interactive report: its data, and the page itself in headless Chromium (skipped where none is installed)."""
from __future__ import annotations

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
from layerprof.render.report import report_data

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
    check = json.loads(found.group(1).replace("&quot;", '"'))
    assert check["names"] == ["", "0", "1", "1.0", "1.1", "2"]  # the SVG holds a cell per module
    assert check["zoomedTo"] == "0" and check["cellsAfterZoom"] == 1  # a click on Linear "0" zoomed to it
    assert [m for m, _ in check["metrics"]] == ["forward_ms", "backward_ms", "total_ms", "flops", "params"]
    assert check["rows"] == 6 and check["sortedFirst"] == "Sequential"  # sorted by forward time: the root first
    assert check["filtered"] == 3  # "linear" matches the three Linear modules by type
    assert check["tooltip"].startswith("Sequential Sequential") and "Forward Time" in check["tooltip"]
    assert "<title>0</title>" in dom  # the zoomed icicle, in the final DOM
    assert dom.count('<td class="type">Linear</td>') == 3  # the filtered table
