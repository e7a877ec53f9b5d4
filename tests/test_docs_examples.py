"""Every code block of README.md and docs/**/*.md, run as the page shows it: one test per block (id `page:line`).

Blocks of a page share one temporary directory and run in page order; running one block alone runs the page's
earlier blocks first. A block preceded by `<!-- docs-test: skip: REASON -->` is reported as skipped with its reason.
The runner is tests/docs_examples.py (`python -m tests.docs_examples --regenerate` rewrites the shown outputs).
"""
from __future__ import annotations

import pytest

from tests import docs_examples

PAGES = docs_examples.pages()
BLOCKS = [(path, index, block)
          for path in PAGES
          for index, block in enumerate(docs_examples.parse(path.read_text(), docs_examples.page_name(path)))
          if block.action != "show"]


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    runs: dict = {}

    def get(path):
        if path not in runs:
            runs[path] = docs_examples.Page.load(path, tmp_path_factory.mktemp(path.stem))
        return runs[path]
    return get


@pytest.mark.parametrize("path,index,block", BLOCKS, ids=[block.id for _, _, block in BLOCKS])
def test_block(path, index, block, page_runs):
    if block.action == "skip":
        pytest.skip(f"{block.id}: {block.skip}")
    docs_examples.check_output(block, page_runs(path).run(index))


def test_pages_have_blocks():
    # The README and the guide's pages exist and hold code that runs: an emptied page or a broken glob fails here.
    names = {path.relative_to(docs_examples.ROOT).as_posix() for path, _, block in BLOCKS if block.action == "run"}
    assert "README.md" in names
    assert len(names) >= 2, names
