"""Run the code blocks of the README and the guide, as a reader would, and keep the output shown under them true.

A page's blocks run in page order, each in a fresh interpreter, in one temporary directory per page (so a block may
read a file an earlier block of the same page wrote). What runs and how, marked by an HTML comment on the last
non-blank line above a fence:

- a ```python block is a script, run with ``sys.executable -c``; a ```bash block runs its lines with ``bash -e``
  (lines continued with ``\\`` joined), ``python`` and ``layerprof`` resolving to this interpreter's;
- ``<!-- docs-test: skip: REASON -->``: not run; the reason is reported;
- ``<!-- docs-test: file: NAME -->``: the block is written to NAME in the page's directory instead of run;
- ``<!-- docs-test: output -->`` above a ```text block right after a runnable block: that block's stdout. It is
  compared with a fresh run with every number masked and whitespace collapsed (timings vary, structure may not),
  and ``--regenerate`` rewrites it from a run.

A block that fails naming an optional package (an extra of pyproject.toml: pandas, lightning, transformers, timm,
tensorboard, ...) that this interpreter cannot import is skipped with that reason, not failed, and so is a later
block of its page that fails (it may need what the skipped one made); where the package is installed, the
failure stands.

Other fences (```text, ```toml, ...) are not run. By hand::

    python -m tests.docs_examples [--regenerate] [FILE.md ...]
"""
from __future__ import annotations

import argparse
import atexit
import difflib
import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE = ("python", "bash")
TIMEOUT_S = 480
TEARDOWN_ABORT = "terminate called without an active exception"  # std::terminate from a joinable thread at exit
TEARDOWN_RUNS = 3  # runs of a block whose only failure is that abort

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>skip|file|output)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")
# A number: 1,234 / 12.5 / 1e-05 / .5 / 0x1f. Masked with its time unit, since a time may cross from µs to ms.
_NUMBER = r"(?:0x[0-9a-fA-F]+|(?:\d[\d,_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_TIME = re.compile(_NUMBER + r"\s*(?:ns|µs|us|ms|s)\b")
# A number with an SI or binary prefix before its unit: a rate (FLOP/s, B/s) moves from one prefix to the next.
_PREFIXED = re.compile(_NUMBER + r"\s*[kKMGTPE]i?(?=[A-Za-z/])")
_NUMBER_RE = re.compile(_NUMBER)
_RULE = re.compile(r"([-=─━:]){3,}")
# A noun after a masked count: a count that may be 1 on one run and 2 on the next ("1 module", "2 modules") is
# compared in its singular. Irregular plurals the library prints (units.format_counted) are listed.
_COUNTED = re.compile(r"(<n>\s+)([A-Za-z]+)")
_IRREGULAR = {"children": "child", "batches": "batch", "processes": "process", "matches": "match"}
# A norm layer's bias in torch's own extra_repr ("affine=True, bias=True"): torch 2.14 prints it, torch 2.11 does
# not. Torch's text, not layerprof's: compared without it.
_NORM_BIAS = re.compile(r"(affine=(?:True|False)), bias=(?:True|False)")


class DocsExampleError(AssertionError):
    """A block failed, timed out, or printed other than what its page shows."""


class DocsExampleSkip(Exception):
    """A block failed for want of an optional package that is not installed here (``missing_optional``)."""


@dataclass
class Block:
    """One fenced code block of a page, with what its marker says to do with it."""

    path: str            # the page, relative to the repository root (as in test ids)
    line: int            # 1-based line of the opening fence
    lang: str            # the info string's first word, lower case ("" when none)
    code: str            # the block's text, its fence's indentation removed
    end: int             # 1-based line of the closing fence
    skip: str | None = None      # the stated reason, for a skipped block
    file: str | None = None      # where a file block is written, relative to the page directory
    output: "Block | None" = None  # the ```text block holding this block's stdout
    is_output: bool = False      # this block is another block's output

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def action(self) -> str:
        """``run``, ``file``, ``skip``, or ``show`` (a fence that is not run, an output block included)."""
        if self.skip is not None:
            return "skip"
        if self.file is not None:
            return "file"
        return "run" if self.lang in RUNNABLE and not self.is_output else "show"


def parse(text: str, path: str = "<text>") -> list[Block]:
    """Every fenced block of a Markdown text, markers applied; raises ValueError on a misplaced marker."""
    lines = text.splitlines()
    blocks: list[Block] = []
    marker: tuple[str, str | None, int] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _MARKER.match(line)
        if found:
            if marker is not None:
                raise ValueError(f"{path}:{marker[2]}: docs-test marker not followed by a code block")
            marker = (found["kind"], found["arg"], i + 1)
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if line.strip() and marker is not None:
                raise ValueError(f"{path}:{marker[2]}: docs-test marker not followed by a code block "
                                 f"(the fence must come next; blank lines are allowed)")
            i += 1
            continue
        indent, mark = fence["indent"], fence["fence"]
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(mark[0] * len(mark))
                                      and not lines[j].strip().strip(mark[0])):
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: code block never closed")
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
        info = fence["info"].strip().split()
        block = Block(path, i + 1, info[0].lower() if info else "", "\n".join(body) + ("\n" if body else ""), j + 1)
        if marker is not None:
            kind, arg, at = marker
            if kind == "skip":
                if not arg:
                    raise ValueError(f"{path}:{at}: a skip marker needs a reason: <!-- docs-test: skip: REASON -->")
                block.skip = arg
            elif kind == "file":
                if not arg or Path(arg).is_absolute() or ".." in Path(arg).parts:
                    raise ValueError(f"{path}:{at}: a file marker needs a relative NAME: <!-- docs-test: file: NAME -->")
                block.file = arg
            else:
                previous = blocks[-1] if blocks else None
                if previous is None or previous.action != "run" or previous.output is not None:
                    raise ValueError(f"{path}:{at}: an output marker must follow a block that runs")
                block.is_output = True
                previous.output = block
            marker = None
        blocks.append(block)
        i = j + 1
    if marker is not None:
        raise ValueError(f"{path}:{marker[2]}: docs-test marker at the end of the page")
    return blocks


def mask(text: str) -> str:
    """The text as compared: times, prefixed quantities, then other numbers masked, the noun after a count made
    singular, rules shortened, whitespace runs collapsed, a norm layer's bias dropped."""
    text = _NORM_BIAS.sub(r"\1", text)
    text = _TIME.sub("<t>", text)
    text = _PREFIXED.sub("<n> ", text)
    text = _NUMBER_RE.sub("<n>", text)
    text = _COUNTED.sub(lambda m: m.group(1) + _singular(m.group(2)), text)
    text = _RULE.sub(r"\1\1\1", text)
    return " ".join(text.split())


def _singular(noun: str) -> str:
    if noun in _IRREGULAR:
        return _IRREGULAR[noun]
    return noun[:-1] if noun.endswith("s") and not noun.endswith("ss") and len(noun) > 3 else noun


def bash_script(code: str) -> str:
    """A bash block's commands: continuations joined, blank and comment lines dropped, one command a line."""
    commands, pending = [], ""
    for line in code.splitlines():
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1].rstrip()
            continue
        if line.strip() and not line.strip().startswith("#"):
            commands.append(line.strip())
    if pending:
        commands.append(pending.strip())
    return "\n".join(commands) + "\n"


@functools.cache
def _command_folder() -> str:
    """A folder (one per process, removed at exit) holding a ``layerprof`` command that runs this interpreter's
    ``layerprof.cli``: the console script beside ``sys.executable`` exists only where layerprof is installed there,
    and without it a block's ``layerprof`` ran whichever one came next on the path (another interpreter, another
    torch) or none."""
    folder = tempfile.mkdtemp(prefix="layerprof-docs-bin-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    command = Path(folder, "layerprof")
    command.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "
                       "'import sys; from layerprof.cli import main; sys.exit(main())' \"$@\"\n")
    command.chmod(0o755)
    return folder


def environment() -> dict[str, str]:
    """The environment a block runs in: this checkout first on the path, ``python`` and ``layerprof`` this
    interpreter's, no display, no download, no progress bar."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((_command_folder(), str(Path(sys.executable).parent), env.get("PATH", "")))
    env.update(MPLBACKEND="Agg", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    return env


@functools.cache
def optional_packages() -> dict[str, str]:
    """Module name -> the extra that installs it, for every package of pyproject.toml's optional dependencies
    (the extra of its own name, else the first that lists it; a distribution's name with ``-`` read as ``_``)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[)", text, re.M | re.S)
    found: dict[str, str] = {}
    extra = None
    for line in section.group(1).splitlines() if section else ():
        named = re.match(r"\s*([A-Za-z0-9_-]+)\s*=", line)
        if named:
            extra = named.group(1)
        for requirement in re.findall(r'"([A-Za-z0-9_.-]+)', line.split("#")[0]):
            module = requirement.replace("-", "_").lower()
            found[module] = module if module == extra else found.get(module, extra or "")  # its own extra first
    return found


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken package, or one an import hook hides
        return False


def missing_optional(stderr: str) -> str | None:
    """Why a block that failed with ``stderr`` is skipped: an optional package its error names that this
    interpreter cannot import; None where there is none (the failure stands)."""
    for module, extra in optional_packages().items():
        if re.search(rf"\b{re.escape(module)}\b", stderr) and not _installed(module):
            return f"needs {module}, not installed here: pip install -e \".[{extra}]\""
    return None


def run_block(block: Block, workdir: Path, timeout: float = TIMEOUT_S) -> str:
    """Run (or write) one block in workdir; its stdout. Raises DocsExampleError when it fails or times out."""
    if block.action == "file":
        target = workdir / block.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code)
        if block.lang == "python":
            try:
                compile(block.code, block.file, "exec")
            except SyntaxError as error:
                raise DocsExampleError(f"{block.id}: file block {block.file} is not valid Python: {error}") from None
        return ""
    if block.action != "run":
        return ""
    if block.lang == "python":
        command = [sys.executable, "-c", block.code]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", bash_script(block.code)]
    for attempt in range(TEARDOWN_RUNS):
        try:
            done = subprocess.run(command, cwd=workdir, env=environment(), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DocsExampleError(f"{block.id}: timed out after {timeout:.0f} s") from None
        # Another run, up to TEARDOWN_RUNS in all, where a rank of a torchrun block aborted in gloo's teardown after
        # the script was done (torch's threads at interpreter exit; about 1 run in 40 of the suite, 0 in 20 runs of
        # the block alone, and twice in a row once, in a fresh clone's suite): the last failure still fails.
        if done.returncode == 0 or TEARDOWN_ABORT not in done.stderr or attempt == TEARDOWN_RUNS - 1:
            break
    if done.returncode != 0:
        missing = missing_optional(done.stderr)
        if missing is not None:
            raise DocsExampleSkip(f"{block.id}: {missing}")
        raise DocsExampleError(f"{block.id}: exit status {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
                               f"\n--- stderr\n{done.stderr[-6000:]}")
    return done.stdout


def check_output(block: Block, stdout: str) -> None:
    """Raise DocsExampleError when the output shown under block differs from stdout (numbers masked)."""
    if block.output is None:
        return
    shown, fresh = mask(block.output.code), mask(stdout)
    if shown != fresh:
        diff = "\n".join(difflib.unified_diff(
            block.output.code.splitlines(), stdout.splitlines(), "shown", "fresh run", lineterm=""))
        raise DocsExampleError(f"{block.id}: the output shown at line {block.output.line} differs from a fresh run "
                               f"(numbers masked); rerun `python -m tests.docs_examples --regenerate {block.path}`\n"
                               f"{diff}")


@dataclass
class Page:
    """One page's blocks and its directory; runs blocks in page order, each at most once."""

    path: str
    blocks: list[Block]
    workdir: Path
    stdout: dict[int, str] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    _done: int = 0

    @classmethod
    def load(cls, path: Path, workdir: Path) -> "Page":
        return cls(page_name(path), parse(path.read_text(), page_name(path)), workdir)

    def run(self, index: int) -> str:
        """Run block `index`, first running the earlier blocks not run yet (their failures are theirs to report)."""
        while self._done <= index:
            block = self.blocks[self._done]
            try:
                self.stdout[self._done] = run_block(block, self.workdir)
            except DocsExampleSkip as skipped:
                self.errors[self._done] = skipped
            except DocsExampleError as error:
                first = next((e for e in self.errors.values() if isinstance(e, DocsExampleSkip)), None)
                # After a block skipped for a missing package, a failure may be for want of what that block made.
                self.errors[self._done] = error if first is None else DocsExampleSkip(
                    f"{block.id}: failed after a skipped block of its page ({first}): "
                    f"{str(error).splitlines()[0].removeprefix(block.id + ': ')}")
            self._done += 1
        if index in self.errors:
            raise self.errors[index]
        return self.stdout.get(index, "")


def page_name(path: Path) -> str:
    """A page's name in test ids: its path from the repository root (``docs/flops.md``)."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def pages(paths: list[str] | None = None) -> list[Path]:
    """The pages whose blocks run: README.md and docs/**/*.md, or the given files."""
    if paths:
        return [Path(p) if Path(p).is_absolute() else Path.cwd() / p for p in paths]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def regenerate(path: Path, workdir: Path) -> int:
    """Run a page and rewrite its output blocks from the runs; the number of output blocks rewritten."""
    page = Page.load(path, workdir)
    lines = path.read_text().splitlines(keepends=True)
    edits = []
    for index, block in enumerate(page.blocks):
        if block.action == "show":
            continue
        stdout = page.run(index)
        if block.output is not None:
            indent = re.match(r"[ \t]*", lines[block.output.line - 1]).group()
            body = [indent + ln if ln else ln for ln in stdout.rstrip("\n").splitlines()]
            edits.append((block.output.line, block.output.end - 1, [ln + "\n" for ln in body]))
    for start, end, body in reversed(edits):   # replace the lines between the fences, last first
        lines[start:end] = body
    path.write_text("".join(lines))
    return len(edits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.docs_examples", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="Markdown files (default: README.md and docs/**/*.md)")
    parser.add_argument("--regenerate", action="store_true", help="rewrite the output blocks from fresh runs")
    args = parser.parse_args(argv)
    counts = {"run": 0, "file": 0, "skip": 0}
    skipped, failed = [], []
    for path in pages(args.files):
        with tempfile.TemporaryDirectory(prefix="docs-") as workdir:
            if args.regenerate:
                print(f"{path.name}: {regenerate(path, Path(workdir))} output blocks rewritten")
                continue
            page = Page.load(path, Path(workdir))
            for index, block in enumerate(page.blocks):
                if block.action == "show":
                    continue
                counts[block.action] += 1
                if block.action == "skip":
                    skipped.append(f"{block.id}: {block.skip}")
                    continue
                try:
                    check_output(block, page.run(index))
                except DocsExampleSkip as missing:
                    counts["run"] -= 1
                    counts["skip"] += 1
                    skipped.append(str(missing))
                except DocsExampleError as error:
                    failed.append(block.id)
                    print(error, file=sys.stderr)
    if not args.regenerate:
        print(f"{counts['run']} blocks run, {counts['file']} written as files, {counts['skip']} skipped, "
              f"{len(failed)} failed")
        for line in skipped:
            print("  skipped", line)
        for name in failed:
            print("  FAILED", name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
