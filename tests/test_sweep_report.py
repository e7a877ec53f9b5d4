"""What a person sees in the plots and the report of real-world profiles: labels that do not collide or run off,
and a report page whose parts fit it (found by a sweep; each test failed before its fix)."""
from __future__ import annotations

import html
import itertools
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from layerprof import LayerProf  # noqa: E402

PEAKS = {"flops": 1e11, "bandwidth": 1e10}


def _crowded_roofline() -> LayerProf:
    """Eight equal Linears whose achieved FLOP/s are set 0.11 decades apart, and a ninth far slower one that
    stretches the y axis over six decades: 0.11 decades are then fewer pixels than a label is tall."""
    torch.manual_seed(0)
    net = nn.Sequential(*(nn.Linear(64, 64) for _ in range(9)))
    with LayerProf(net, metrics=("flops",), peaks=PEAKS) as prof:
        for _ in range(2):
            net(torch.randn(32, 64)).sum().backward()
            prof.step()
    for index, record in enumerate(prof.records[str(i)] for i in range(9)):
        rate = 1e6 if index == 8 else 1e9 * 10 ** (0.11 * index)  # FLOP/s
        ms = record.self_flops / rate * 1000
        record.self_forward_ms, record.self_backward_ms = ms / 3, 2 * ms / 3
    return prof


def test_roofline_labels_neither_collide_nor_leave_the_axes_nor_sit_under_the_legend() -> None:
    ax = _crowded_roofline().plot("roofline", labels=8)
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    legend = ax.get_legend().get_window_extent(renderer)
    labels = [(text.get_text(), text.get_window_extent(renderer)) for text in ax.texts if "(" in text.get_text()]
    assert len(labels) >= 4  # the crowd is still named, where there is room
    for (first, a), (second, b) in itertools.combinations(labels, 2):
        assert not a.overlaps(b), f"{first!r} overlaps {second!r}"
    for text, box in labels:
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text
        assert not box.overlaps(legend), text
    plt.close(ax.figure)


def test_roofline_legend_markers_are_one_size() -> None:
    """The legend showed each bound's first point at its area: one large module made its entry a disc that
    covered the entries beside it."""
    ax = _crowded_roofline().plot("roofline")
    sizes = {float(size) for handle in ax.get_legend().legend_handles if hasattr(handle, "get_sizes")
             for size in handle.get_sizes()}
    assert len(sizes) == 1
    plt.close(ax.figure)


class _Sleeps(nn.Module):
    """A Linear whose forward also sleeps ``seconds``: slices of known width in the report's timeline."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.linear = seconds, nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.seconds)
        return self.linear(x).relu()


def _checkpointed(model: nn.Module) -> nn.Module:
    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)

    return Checkpointed()


def test_report_table_shows_recompute_where_a_module_is_checkpointed() -> None:
    """A checkpointed region's recomputation is inside the backward time of its first node (a Dropout of GPT-2
    read 1.5 ms of backward); the table now has the Recompute column that explains it, and only then."""
    from layerprof.render.report import report_data

    net = nn.Sequential(nn.Linear(8, 8), _checkpointed(nn.Sequential(nn.Linear(8, 8), nn.GELU())))
    with LayerProf(net) as prof:
        for _ in range(2):
            net(torch.randn(4, 8, requires_grad=True)).sum().backward()
            prof.step()
    data = report_data(prof.profile.tree, prof.profile.meta)
    columns = [column["name"] for column in data["columns"]]
    assert "recompute_ms" in columns
    nodes = {node["name"]: node for node in data["nodes"]}
    assert nodes["1.inner.0"]["values"]["recompute_ms"] > 0 and nodes["0"]["values"]["recompute_ms"] is None
    plain = nn.Linear(8, 8)
    with LayerProf(plain) as prof:
        plain(torch.randn(4, 8)).sum().backward()
    assert "recompute_ms" not in [c["name"] for c in report_data(prof.profile.tree, prof.profile.meta)["columns"]]


# Measures the laid-out page: the plan's text within its box, each timeline label within its slice.
_PROBE = """<script>
(function () {
  const pre = document.querySelector("#checkpoint-section pre");
  const labels = Array.from(document.querySelectorAll("#timeline g.slice text")).map((text) => {
    const rect = text.parentNode.querySelector("rect");
    return [text.textContent, text.getComputedTextLength(), +rect.getAttribute("width")];
  });
  const out = document.createElement("pre"); out.id = "probe";
  out.textContent = JSON.stringify({ pre: pre ? [pre.scrollWidth, pre.clientWidth] : null, labels: labels });
  document.body.appendChild(out);
})();
</script>
</body>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no Chromium installed (apt-get install chromium)")
def test_report_plan_text_and_timeline_labels_fit_their_boxes_in_chromium(tmp_path: Path) -> None:
    """The plan's notes ran off the right of the page (a <pre> that never wraps), and a timeline slice over
    40 px wide printed its whole name however long, over the slices after it."""
    from collections import OrderedDict

    net = nn.Sequential(OrderedDict([("slow", _Sleeps(0.04)),
                                     ("a_rather_long_name_for_a_short_module", _Sleeps(0.008)),
                                     ("tail", nn.Linear(64, 64))]))
    with LayerProf(net, metrics=("memory",)) as prof:
        for _ in range(2):
            net(torch.randn(16, 64)).sum().backward()
            prof.step()
    page = prof.to_report()
    assert 'id="checkpoint-section"' in page
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", _PROBE), encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile_dir:
        result = subprocess.run(
            [shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile_dir}", "--window-size=700,900", "--virtual-time-budget=3000",
             "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    probe = json.loads(html.unescape(found.group(1)))
    scroll_width, client_width = probe["pre"]
    assert scroll_width <= client_width
    assert probe["labels"], "no slice was wide enough for a label"
    for text, width, slice_width in probe["labels"]:
        assert width <= slice_width, f"{text!r}: {width:.0f} px of text in a {slice_width:.0f} px slice"
