"""The docs runner itself (tests/docs_examples.py) on small synthetic pages: markers, masking, running, regenerating."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from tests import docs_examples as de

PAGE = """# A page

```python
print("one")
```

<!-- docs-test: skip: needs four GPUs -->

```bash
torchrun --nproc_per_node=4 train.py
```

<!-- docs-test: file: helper.py -->
```python
VALUE = 41
```

```python
import helper
print("value", helper.VALUE + 1, "in", 12.5, "ms")
```
<!-- docs-test: output -->
```text
value 42 in 12.5 ms
```

```toml
[not] = "run"
```
"""


def test_parse_markers():
    blocks = de.parse(PAGE, "page.md")
    # 6 fences: print, torchrun (skipped), helper.py (file), import (run), its output, toml (shown only)
    assert [(b.line, b.lang, b.action) for b in blocks] == [
        (3, "python", "run"), (9, "bash", "skip"), (14, "python", "file"), (18, "python", "run"),
        (23, "text", "show"), (27, "toml", "show")]
    assert blocks[1].skip == "needs four GPUs"
    assert blocks[2].file == "helper.py" and blocks[2].code == "VALUE = 41\n"
    assert blocks[3].output is blocks[4] and blocks[4].is_output
    assert blocks[0].output is None
    assert blocks[3].id == "page.md:18"


@pytest.mark.parametrize("text,message", [
    ("<!-- docs-test: skip -->\n```python\npass\n```\n", "needs a reason"),
    ("<!-- docs-test: output -->\n```text\nx\n```\n", "must follow a block that runs"),
    ("<!-- docs-test: file: ../x.py -->\n```python\npass\n```\n", "relative NAME"),
    ("<!-- docs-test: skip: why -->\nsome prose\n```python\npass\n```\n", "not followed by a code block"),
    ("```python\npass\n", "never closed"),
])
def test_parse_rejects_misplaced_markers(text, message):
    with pytest.raises(ValueError, match=message):
        de.parse(text, "bad.md")


def test_mask_ignores_numbers_and_spacing_not_words():
    assert de.mask("forward 68.8 ms  (36.1%)\n") == de.mask("forward   205 µs (0.1%)")
    assert de.mask("| a |---:|\n| 1,234 |") == de.mask("| a |-----:|\n| 7 |")
    assert de.mask("FLOP/s: 297 MFLOP/s, 4 KiB") == de.mask("FLOP/s: 2.07 GFLOP/s, 1 MiB")
    assert de.mask("forward 1 ms") != de.mask("backward 1 ms")
    assert de.mask("3 GFLOPs") != de.mask("3 GB")
    assert de.mask("5 children") != de.mask("5 children, 2 calls")
    # A count that is 1 on one run and 2 on the next: the noun compares in its singular, the words still count.
    assert de.mask("+2.74 ms per step, 2 modules wrapped") == de.mask("+3.1 ms per step, 1 module wrapped")
    assert de.mask("3 children, 2 processes") == de.mask("1 child, 1 process")
    assert de.mask("2 modules wrapped") != de.mask("2 runs wrapped")
    assert de.mask("2 modules wrapped") != de.mask("1 module and 1 run wrapped")
    # A norm's bias, in torch 2.14's extra_repr and not in 2.11's; any other difference still counts.
    assert de.mask("(64, eps=1e-05, affine=True, bias=True, track_running_stats=True)") == de.mask(
        "(64, eps=1e-05, affine=True, track_running_stats=True)")
    assert de.mask("(8,), elementwise_affine=True, bias=True)") == de.mask("(8,), elementwise_affine=True)")
    assert de.mask("(8,), elementwise_affine=True)") != de.mask("(8,), elementwise_affine=False)")
    assert de.mask("(in_features=8, bias=True)") != de.mask("(in_features=8)")


def test_layerprof_in_a_block_is_this_interpreters(tmp_path):
    # The console script beside sys.executable may be missing (layerprof not installed there) or another
    # interpreter's may come first on the path: a block's `layerprof` runs this one's, from this checkout.
    md = tmp_path / "page.md"
    md.write_text("```bash\nlayerprof --help | head -1\nwhich layerprof\n```\n")
    usage, command = de.Page.load(md, tmp_path).run(0).splitlines()
    assert usage.startswith("usage: layerprof SPEC --input SHAPE")
    assert f"exec {shlex.quote(sys.executable)} -c " in Path(command).read_text()


def test_bash_script_joins_continuations_and_drops_comments():
    code = "# a comment\nlayerprof a \\\n   --depth 2\n\necho done\n"
    assert de.bash_script(code) == "layerprof a --depth 2\necho done\n"


def test_page_runs_in_order_and_checks_output(tmp_path):
    md = tmp_path / "page.md"
    md.write_text(PAGE)
    page = de.Page.load(md, tmp_path)
    # block 3 imports helper.py, which block 2 writes: running it alone runs the earlier blocks first
    stdout = page.run(3)
    assert stdout == "value 42 in 12.5 ms\n"
    assert page.stdout[0] == "one\n" and (tmp_path / "helper.py").read_text() == "VALUE = 41\n"
    de.check_output(page.blocks[3], stdout)
    de.check_output(page.blocks[3], "value 42 in 3 µs\n")          # another timing: same structure
    with pytest.raises(de.DocsExampleError, match="differs from a fresh run"):
        de.check_output(page.blocks[3], "value 42 in 12.5 ms\nextra line\n")


def test_failing_block_reports_its_error(tmp_path):
    md = tmp_path / "page.md"
    md.write_text("```python\nraise SystemExit('boom')\n```\n\n```bash\nfalse\necho never\n```\n")
    page = de.Page.load(md, tmp_path)
    with pytest.raises(de.DocsExampleError, match="(?s)page.md:1: exit status 1.*boom"):
        page.run(0)
    with pytest.raises(de.DocsExampleError, match="exit status 1"):   # bash -e stops at `false`
        page.run(1)


def test_optional_packages_are_read_from_pyproject():
    # Every extra's packages, named as imported, each under its own extra where it has one.
    found = de.optional_packages()
    assert {name: found[name] for name in ("pandas", "lightning", "transformers", "accelerate", "tensorboard",
                                           "timm", "mkdocs")} == {
        "pandas": "examples", "lightning": "lightning", "transformers": "transformers", "accelerate": "transformers",
        "tensorboard": "tensorboard", "timm": "test", "mkdocs": "docs"}
    assert "torch" not in found and "numpy" not in found  # dependencies, not extras: their failures stand


def test_a_block_needing_a_missing_optional_package_skips_and_so_do_its_pages_later_failures(tmp_path, monkeypatch):
    # "layerprof_absent_extra" stands for an extra's package that is not installed here; "json" for one that is.
    monkeypatch.setattr(de, "optional_packages", lambda: {"layerprof_absent_extra": "examples", "json": "examples"})
    md = tmp_path / "page.md"
    md.write_text("```python\nimport layerprof_absent_extra\nopen('made.txt', 'w')\n```\n\n"
                  "```python\nprint(open('made.txt').read())\n```\n")
    page = de.Page.load(md, tmp_path)
    with pytest.raises(de.DocsExampleSkip, match=r'page.md:1: needs layerprof_absent_extra, not installed here: '
                                                 r'pip install -e "\.\[examples\]"$'):
        page.run(0)
    # The second block failed (no made.txt): after the skip, skipped too, its own error kept in the reason.
    with pytest.raises(de.DocsExampleSkip, match=r"page.md:6: failed after a skipped block of its page "
                                                 r"\(\S*page.md:1: needs layerprof_absent_extra.*\): exit status 1$"):
        page.run(1)
    # An installed package named in an error, or a failure on a page with no skip: the failure stands.
    other = tmp_path / "other.md"
    other.write_text("```python\nimport json\nraise SystemExit('json broke')\n```\n\n"
                     "```python\nimport layerprof_absent_module_not_an_extra\n```\n")
    page = de.Page.load(other, tmp_path)
    with pytest.raises(de.DocsExampleError, match="json broke"):
        page.run(0)
    with pytest.raises(de.DocsExampleError, match="No module named 'layerprof_absent_module_not_an_extra'"):
        page.run(1)


def test_a_teardown_abort_is_run_again_up_to_three_times_and_nothing_else_is(tmp_path):
    # Each block counts its runs in a file; the first aborts as gloo's teardown does the first two times only, the
    # second every time, the third fails otherwise.
    abort = f"echo x >> {{name}}; echo 'the output'; echo '{de.TEARDOWN_ABORT}' >&2"
    md = tmp_path / "page.md"
    md.write_text(
        f"```bash\n{abort.format(name='twice')}; [ $(wc -l < twice) -ge 3 ]\n```\n\n"
        f"```bash\n{abort.format(name='always')}; false\n```\n\n"
        "```bash\necho x >> other; echo 'another error' >&2; false\n```\n")
    page = de.Page.load(md, tmp_path)
    workdir = tmp_path / "work"
    workdir.mkdir()
    assert de.run_block(page.blocks[0], workdir) == "the output\n"
    with pytest.raises(de.DocsExampleError, match="exit status 1"):
        de.run_block(page.blocks[1], workdir)
    with pytest.raises(de.DocsExampleError, match="another error"):
        de.run_block(page.blocks[2], workdir)
    assert de.TEARDOWN_RUNS == 3
    assert [len((workdir / name).read_text().split()) for name in ("twice", "always", "other")] == [3, 3, 1]


def test_regenerate_rewrites_output_blocks(tmp_path):
    md = tmp_path / "page.md"
    md.write_text(PAGE.replace("value 42 in 12.5 ms", "stale"))
    assert de.regenerate(md, tmp_path) == 1
    assert md.read_text() == PAGE
