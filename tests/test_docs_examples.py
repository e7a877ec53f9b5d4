"""Every code block of README.md and docs/**/*.md, run as the page shows it: one test per block (id `page:line`).

Blocks of a page share one temporary directory and run in page order, each in a fresh interpreter; pages are
independent, so the pages of the selected tests run side by side (`LAYERPROF_DOCS_WORKERS`, default: up to 2
at once) and each test waits for its block. Under pytest-xdist a worker runs a page only when one of its blocks
comes to it (every worker collects every test: ahead of time, each would run every page); `--dist loadgroup` keeps
a page's blocks on one worker (each test is in its page's `xdist_group`). A block preceded by `<!-- docs-test: skip: REASON -->` is reported
as skipped with its reason, and so is one that fails for want of an optional package not installed here. The
runner is tests/docs_examples.py (`python -m tests.docs_examples --regenerate` rewrites the shown outputs).
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests import docs_examples

PAGES = {docs_examples.page_name(path): docs_examples.parse(path.read_text(), docs_examples.page_name(path))
         for path in docs_examples.pages()}
BLOCKS = [(name, index, block) for name, blocks in PAGES.items()
          for index, block in enumerate(blocks) if block.action != "show"]


def _workers() -> int:
    value = os.environ.get("LAYERPROF_DOCS_WORKERS")
    return max(1, int(value)) if value else max(1, min(2, os.cpu_count() or 1))


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory):
    """The pages of the selected tests, each run to the last selected block in a worker thread."""
    wanted: dict[str, int] = {}
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "originalname", None) == "test_block" and "name" in params:
            wanted[params["name"]] = max(wanted.get(params["name"], -1), params["index"])
    ahead = not os.environ.get("PYTEST_XDIST_WORKER")
    pool = ThreadPoolExecutor(_workers() if ahead else 1, thread_name_prefix="docs-page")
    runs: dict[str, tuple[docs_examples.Page, Future]] = {}
    for name in sorted(wanted, key=lambda n: -wanted[n]):          # long pages first
        page = docs_examples.Page(name, PAGES[name], tmp_path_factory.mktemp(name.replace("/", "-")))
        if ahead:
            runs[name] = page, pool.submit(_run_quietly, page, wanted[name])
        else:  # run by the page's first test on this worker, to its own block
            runs[name] = page, Future()
            runs[name][1].set_result(None)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


def _run_quietly(page: docs_examples.Page, last: int) -> None:
    try:
        page.run(last)
    except (docs_examples.DocsExampleError, docs_examples.DocsExampleSkip):
        pass                      # kept in page.errors, raised by that block's own test


@pytest.mark.parametrize("name,index,block", [pytest.param(*entry, marks=pytest.mark.xdist_group(entry[0]))
                                              for entry in BLOCKS], ids=[block.id for _, _, block in BLOCKS])
def test_block(name, index, block, page_runs):
    if block.action == "skip":
        pytest.skip(f"{block.id}: {block.skip}")
    page, done = page_runs[name]
    done.result()
    try:
        stdout = page.run(index)
    except docs_examples.DocsExampleSkip as missing:  # an optional package not installed here
        pytest.skip(str(missing))
    docs_examples.check_output(block, stdout)


def test_pages_have_blocks():
    # The README and the guide's pages exist and hold code that runs: an emptied page or a broken glob fails here.
    names = {name for name, _, block in BLOCKS if block.action == "run"}
    assert "README.md" in names
    assert len(names) >= 2, names
