"""What a reader sees in the rendered outputs of this week's new kinds of profiles: a run interrupted part-way
(partial), modules run in the counted step only (an encoder in a profile stepped per token), modules run in some
steps only (stochastic depth), a forward-only profile; the HTML report, the plots and the summary text."""
from __future__ import annotations

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
from layerprof.render.report import report_data

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


def _partial() -> LayerProf:
    """Three steps of a small MLP, then Ctrl-C: the block ends on KeyboardInterrupt."""
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    prof = LayerProf(net)
    with pytest.raises(KeyboardInterrupt):
        with prof:
            for step in range(5):
                net(torch.randn(2, 8)).sum().backward()
                prof.step()
                if step == 2:
                    raise KeyboardInterrupt
    return prof


class _Skippy(nn.Module):
    """``encoder`` runs in the first step only (the one FLOPs are counted in), ``extra`` in every other step."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.body = nn.Linear(8, 8)
        self.extra = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step == 0:
            x = self.encoder(x)
        x = self.body(x)
        return self.extra(x) if self.step % 2 == 1 else x


def _skippy() -> LayerProf:
    """Four steps: the first counts FLOPs (the times leave it out); of the three timed, ``extra`` runs in 2."""
    model = _Skippy()
    with pytest.warns(RuntimeWarning, match="first profiled step"):
        with LayerProf(model, metrics=("flops",)) as prof:
            for step in range(4):
                model.step = step
                model(torch.randn(2, 8)).sum().backward()
                prof.step()
    return prof


def _selftest(path: Path) -> tuple[dict, str]:
    with tempfile.TemporaryDirectory() as profile_dir:
        result = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile_dir}",
             "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
             "--window-size=1200,900", path.as_uri() + "#selftest"],
            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [line for line in result.stderr.splitlines() if ":CONSOLE" in line] == []
    found = re.search(r'<pre id="selftest">(.*?)</pre>', result.stdout, re.S)
    assert found, "the page's self-test did not run: a script error stopped it"
    return json.loads(html.unescape(found.group(1))), result.stdout


# -- the HTML report ---------------------------------------------------------------------------------------------
def test_report_of_a_partial_profile_says_it_is_partial() -> None:
    """The summary's first line says a run ended early; the report said only "3 profiled steps", as if complete."""
    prof = _partial()
    data = report_data(prof.profile.tree, prof.profile.meta)
    assert data["notice"] == "Partial profile (3 steps recorded): interrupted (KeyboardInterrupt)"
    assert prof.layerwise_summary().splitlines()[0] == data["notice"] + "."
    page = prof.to_report()
    assert '<p id="notice" role="note">Partial profile (3 steps recorded)' in page
    complete = nn.Sequential(nn.Linear(2, 2))
    with LayerProf(complete) as whole:
        complete(torch.randn(1, 2))
    assert report_data(whole.profile.tree, whole.profile.meta)["notice"] is None
    assert 'id="notice"' not in whole.to_report()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium)")
def test_report_notice_in_the_browser(tmp_path: Path) -> None:
    path = tmp_path / "partial.html"
    _partial().to_report(path)
    _, dom = _selftest(path)
    assert ('<p id="notice" role="note">Partial profile (3 steps recorded): interrupted (KeyboardInterrupt)</p>'
            in dom)
