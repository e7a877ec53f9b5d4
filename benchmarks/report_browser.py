"""The interactive report on a 10,000-module model in headless Chromium: load, metric switch, filter keystroke.

The model (``--model list``) is a ModuleList of 100 blocks, each a ModuleList of 99 Linear(8, 8) (10,002
modules), the blocks and their layers iterated in the forward, so the report also draws the summed containers;
``--model sequential`` holds the same layers in nn.Sequential containers, all called. One profiled step is
written as a report by each checkout given (``--checkout DIR``, default: this one), in a subprocess with that
checkout first on ``sys.path``; Chromium then opens each page with a timing script appended after the page's own,
which reads, with the same DOM events for every version of the page:

* load: ``performance.now()`` once the page's script has drawn everything and the layout is forced;
* switch: a change of the metric select to each metric in turn, then a forced layout (median over them);
* keystroke: the filter set to "1", "10", "10.", "10.5" (one more letter each), an ``input`` event each, then a
  forced layout (median).

Paint is not timed (headless, no frame is drawn). Usage::

    python benchmarks/report_browser.py --checkout /path/to/main --checkout . --repeat 3
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WRITE = r"""
import sys, torch
torch.set_num_threads(1)
from torch import nn
from layerprof import LayerProf

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleList(nn.Linear(8, 8) for _ in range(99)) for _ in range(100))
    def forward(self, x):
        for block in self.blocks:
            for layer in block:
                x = layer(x)
        return x

torch.manual_seed(0)
if sys.argv[2] == "list":
    net = Net()
else:  # the same layers in called containers: every module has times of its own
    net = nn.Sequential(*(nn.Sequential(*(nn.Linear(8, 8) for _ in range(99))) for _ in range(100)))
with LayerProf(net, metrics=("params", "flops")) as prof:
    net(torch.randn(4, 8)).sum().backward()
    prof.step()
prof.profile.to_report(sys.argv[1])
import layerprof
print(layerprof.__file__, sum(1 for _ in net.modules()))
"""

TIMING = """<script>
(function () {
  const loaded = (document.body.offsetHeight, performance.now());
  const select = document.getElementById("metric"), filter = document.getElementById("filter");
  function timed(action) { const t = performance.now(); action(); void document.body.offsetHeight; return performance.now() - t; }
  const switches = [];
  const options = Array.from(select.options).map((o) => o.value);
  options.slice(1).concat(options.slice(0, 1)).forEach((v) => switches.push(timed(() => {
    select.value = v; select.dispatchEvent(new Event("change")); })));
  const keys = ["1", "10", "10.", "10.5"].map((text) => timed(() => {
    filter.value = text; filter.dispatchEvent(new Event("input")); }));
  const cells = document.querySelectorAll("#icicle g").length;
  const pre = document.createElement("pre"); pre.id = "bench";
  pre.textContent = JSON.stringify({ load: loaded, switches: switches, keys: keys, cells: cells,
                                     elements: document.getElementsByTagName("*").length });
  document.body.appendChild(pre);
})();
</script>
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("no Chromium on PATH (apt-get install chromium)")


def write_page(checkout: Path, path: Path, model: str) -> int:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    # run from the page's folder: `python -c` puts the working directory first on sys.path
    done = subprocess.run([sys.executable, "-c", WRITE, str(path), model], env=env, capture_output=True, text=True,
                          check=True, cwd=path.parent)
    print(done.stdout.split()[0], end=" ")  # which layerprof wrote it
    page = path.read_text(encoding="utf-8")
    path.write_text(page.replace("</body>", TIMING + "</body>"), encoding="utf-8")
    return int(done.stdout.split()[-1])


def measure(browser: str, path: Path) -> dict:
    with tempfile.TemporaryDirectory() as profile_dir:
        result = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", f"--user-data-dir={profile_dir}", "--window-size=1400,900",
             "--virtual-time-budget=60000", "--dump-dom", path.as_uri()],
            capture_output=True, text=True, timeout=600)
    found = re.search(r'<pre id="bench">(.*?)</pre>', result.stdout)
    if not found:
        raise RuntimeError(f"the page did not finish: {result.stderr[-1500:]}")
    return json.loads(found.group(1).replace("&quot;", '"'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", action="append", type=Path, help="a layerprof checkout (repeatable)")
    parser.add_argument("--repeat", type=int, default=3, help="page loads per checkout, interleaved")
    parser.add_argument("--model", choices=("list", "sequential"), default="list",
                        help="list: ModuleLists iterated (summed containers); sequential: nn.Sequential, all called")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in (args.checkout or [Path(__file__).resolve().parents[1]])]
    browser = chromium()
    with tempfile.TemporaryDirectory() as folder:
        pages = []
        for index, checkout in enumerate(checkouts):
            page = Path(folder) / f"report{index}.html"
            modules = write_page(checkout, page, args.model)
            pages.append(page)
            print(f"{checkout}: {modules} modules, page {page.stat().st_size / 1e6:.2f} MB")
        runs: dict[int, list[dict]] = {index: [] for index in range(len(pages))}
        for _ in range(args.repeat):  # interleaved, so that the machine's load falls on every checkout alike
            for index, page in enumerate(pages):
                runs[index].append(measure(browser, page))
    print(f"{'checkout':<40} {'load ms':>9} {'switch ms':>10} {'keystroke ms':>13} {'icicle cells':>13} {'elements':>9}")
    for index, checkout in enumerate(checkouts):
        results = runs[index]
        load = statistics.median(r["load"] for r in results)
        switch = statistics.median(t for r in results for t in r["switches"])
        key = statistics.median(t for r in results for t in r["keys"])
        print(f"{str(checkout)[-40:]:<40} {load:>9.0f} {switch:>10.1f} {key:>13.1f} {results[0]['cells']:>13} "
              f"{results[0]['elements']:>9}")


if __name__ == "__main__":
    main()
