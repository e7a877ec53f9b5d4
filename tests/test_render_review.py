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
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile_dir}",
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


def test_report_notes_modules_run_in_the_counted_step_or_some_steps_only() -> None:
    """The table showed "0" calls beside the encoder's FLOPs and "0.667" calls for a module run in 2 of 3 steps,
    with nothing saying why; it now has a Note column (and a tooltip line) with what the summary says."""
    prof = _skippy()
    data = report_data(prof.profile.tree, prof.profile.meta)
    nodes = {node["name"]: node for node in data["nodes"]}
    assert data["columns"][-1] == {"name": "note", "label": "Note", "numeric": False}
    assert nodes["encoder"]["note"] == "ran only in the counted step, which the times leave out"
    assert nodes["encoder"]["note_short"] == "counted step only"
    assert nodes["encoder"]["values"]["calls"] == 0 and nodes["encoder"]["values"]["flops"] > 0
    assert nodes["extra"]["note"] == "ran in 2 of 3 steps"
    assert nodes["unused"]["note"] == "not run"
    assert nodes["body"]["note"] == "" and nodes[""]["note"] == ""
    summary = prof.layerwise_summary()
    assert "ran in 2 of 3 steps" in summary and "ran only in the counted step" in summary
    plain = _partial()  # every module ran in every step: no Note column
    assert all(c["name"] != "note" for c in report_data(plain.profile.tree, plain.profile.meta)["columns"])


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium)")
def test_report_notice_and_notes_in_the_browser(tmp_path: Path) -> None:
    path = tmp_path / "partial.html"
    _partial().to_report(path)
    _, dom = _selftest(path)
    assert ('<p id="notice" role="note">Partial profile (3 steps recorded): interrupted (KeyboardInterrupt)</p>'
            in dom)
    path = tmp_path / "skippy.html"
    _skippy().to_report(path)
    check, dom = _selftest(path)
    assert '<th class="text">Note</th>' in dom
    assert '<td class="text" title="ran in 2 of 3 steps">ran in 2 of 3 steps</td>' in dom
    # (short in its cell, so that the table fits the page; whole in the cell's title and the tooltip)
    assert ('<td class="text" title="ran only in the counted step, which the times leave out">counted step only</td>'
            in dom)
    assert "note:" not in check["tooltip"]  # the root ran in every step: no note line


# -- the plots ---------------------------------------------------------------------------------------------------
def test_roofline_of_work_counted_only_in_an_untimed_step_says_so() -> None:
    """An encoder run only in the counted step and a decoder timed in the others (Whisper's beam search stepped
    per token): the roofline refused with "the model's modules only reshape or pass their inputs on", untrue of
    an encoder of convolutions and Linears; it now says where the counted work ran and what to change."""
    model = _Skippy()
    model.body = nn.Identity()  # the timed steps do no counted work of their own (the decoder's, counted nowhere)
    model.extra = nn.Identity()
    with pytest.warns(RuntimeWarning, match="first profiled step"):
        with LayerProf(model, metrics=("flops",), peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
            for step in range(3):
                model.step = step
                model(torch.randn(2, 8, requires_grad=True)).sum().backward()
                prof.step()
    with pytest.raises(ValueError) as error:
        prof.plot("roofline")
    message = str(error.value)
    assert "reshape or pass their inputs on" not in message
    assert message.startswith("nothing to plot on a roofline: the modules with counted work (1 module, such as "
                              "'encoder') ran only in the step the FLOP meter counts (the first profiled one)")


def _with_memory() -> LayerProf:
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    with LayerProf(net, metrics=("memory",)) as prof:
        for _ in range(2):
            net(torch.randn(4, 16)).sum().backward()
            prof.step()
    return prof


def test_report_frontier_scales_with_its_box() -> None:
    """The report's frontier of checkpoint plans had width and height but no viewBox: the page's CSS stretched its
    box to the page's width and the drawing kept to the left 640 px of it; it now scales in a box at most its own
    width."""
    page = _with_memory().to_report()
    svg = re.search(r'<svg class="checkpoint-frontier"[^>]*>', page).group(0)
    assert 'width="640" height="300" viewBox="0 0 640 300"' in svg
    assert "svg.checkpoint-frontier { width: 100%; max-width: 640px; height: auto; }" in page


def test_top_plot_names_the_model_once() -> None:
    """The model's own share read "Sequential (model) (Sequential)" beside "0.f (Linear)"; it reads
    "Sequential (model)"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = _with_memory().plot("top", k=10)
    labels = [label.get_text() for label in ax.get_yticklabels()]
    plt.close(ax.figure)
    assert "Sequential (model)" in labels and not any("(model) (" in label for label in labels)
    assert "0 (Linear)" in labels
