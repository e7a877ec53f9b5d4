"""The command line misused: every option checked before the model is built (exit 2, one line), run failures one
line (exit 5), outputs written all or none, Ctrl-C while torch imports quiet."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from typing import Any
from pathlib import Path

import pytest
import torch

import layerprof
from layerprof.cli import main
from layerprof.cli.errors import RunError
from layerprof.cli.inputs import make_inputs, parse_input

ROOT = Path(__file__).resolve().parent.parent

MODELS = textwrap.dedent('''
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(20, 5)

        def forward(self, x):
            return self.fc(x)


    def broken():
        raise AssertionError("the model was built: options must be checked first")
''')


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("misuse") / "models.py"
    path.write_text(MODELS)
    return path


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "internal error" not in err, err
    return err


@pytest.mark.parametrize("extra, message", [
    (["--plot", "{d}/p.png", "--plot-metric", "flops"],
     "--plot-metric flops needs the flops meter: add --metrics flops"),
    (["--plot", "{d}/p.png", "--plot-metric", "memory", "--metrics", "params"],
     "--plot-metric memory needs the memory meter: add --metrics params,memory"),
    (["--plot", "{d}/p.png", "--plot-metric", "speed"],
     "--plot-metric: unknown plot metric 'speed'; choose from: forward, backward, total,"),
    (["--plot", "{d}/p.png", "--plot-kind", "roofline"],
     "--plot-kind roofline needs the flops meter (FLOPs and bytes): add --metrics flops"),
    (["--plot", "{d}/p.eps"],
     "--plot '{d}/p.eps': a plot is saved as .png, .svg or .pdf; give a path ending in one of them"),
    (["--csv", "{d}"], "--csv '{d}' is a folder; give the path of a file, e.g. '{d}/profile.csv'"),
    (["--json", "/proc/p.json"], "--json '/proc/p.json': cannot write in folder '/proc' ("),
    (["--json", "{d}/p.json", "--trace", "{d}/p.json"], "--trace '{d}/p.json': another output writes there too"),
    (["-i", "99999999999999999999"], "--input '99999999999999999999' has 1e+20 elements, more than a tensor can hold"),
    # integers past what torch takes: an internal error (exit 70, "Overflow when unpacking long") before
    (["--seed", "18446744073709551616"], "argument --seed: expected an integer <= 18446744073709551615, got "
     "18446744073709551616"),
    (["--threads", "99999999999"], "argument --threads: expected an integer <= 2147483647, got 99999999999"),
    (["--vocab", "99999999999999999999"], "argument --vocab: expected an integer <= 9223372036854775807, got "
     "99999999999999999999"),
    # ids drawn past what an integer input's dtype holds: torch's "to - 1 is out of bounds for unsigned char" (exit
    # 5, once the model was built) before
    (["-i", "mask=2:uint8", "--vocab", "300"], "--vocab 300: input mask=2 uint8 draws integers in [0, 300), more "
     "than uint8 holds (at most 255); give --vocab 256 or less, or a wider dtype such as int64"),
    (["-i", "3037000500,3037000500"], "--input '3037000500,3037000500' has 9.22e+18 elements, more than a tensor"),
    # a column no meter of the run records would print "—" on every module
    (["--columns", "forward,flops"], "--columns forward,flops needs the flops meter: add --metrics flops"),
    (["--columns", "input_shapes,saved_bytes", "--metrics", "params"],
     "--columns input_shapes,saved_bytes needs the shapes and memory meter: add --metrics params,shapes,memory"),
    (["--columns", "forward,backward", "--no-backward"], "--columns forward,backward: a run with --no-backward has no "
     "backward pass, so backward would show nothing on any module; drop it or --no-backward"),
    (["--columns", "self_backward,forward,flops_backward", "--eval", "--metrics", "flops"],
     "--columns self_backward,forward,flops_backward: a run with --eval has no backward pass, so "
     "self_backward,flops_backward would show nothing on any module; drop them or --eval"),
    # a figure chosen and no --plot to draw it: ignored, the run went on and wrote no figure, before
    (["--plot-metric", "flops"],
     "--plot-metric flops: no figure is drawn without --plot PATH (a .png, .svg or .pdf)"),
    (["--plot-kind", "top", "--json", "{d}/p.json"],
     "--plot-kind top: no figure is drawn without --plot PATH (a .png, .svg or .pdf)"),
    # an output over the model's own file
    (["--report", "{models}"], "--report '{models}' is the model file this command reads; give the output another"),
    # paths the system refuses: a usage error, not an internal one (exit 70 before)
    (["--csv", "{d}/" + "a" * 300 + ".csv"], "--csv '{d}/aaaa"),
    (["--json", "{d}/loop"], "--json '{d}/loop': cannot be written (Too many levels of symbolic links)"),
    (["--json", "{models}/p.json"], "--json '{models}/p.json': folder '{models}' is a file, not a folder"),
])
def test_options_are_checked_before_the_model_is_built(extra: list[str], message: str, models: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    source = models.read_text()
    if "{d}/loop" in extra:
        os.symlink(tmp_path / "loop", tmp_path / "loop")  # a link to itself
    argv = [f"{models}:broken", "-i", "2,20",
            *(arg.replace("{d}", str(tmp_path)).replace("{models}", str(models)) for arg in extra)]
    assert main(argv) == 2  # `broken` raises if it is built: exit 2 proves the check came first
    message = message.replace("{d}", str(tmp_path)).replace("{models}", str(models))
    assert one_line(capsys).startswith("layerprof: error: " + message)
    assert [p for p in tmp_path.iterdir() if p.name != "loop"] == [] and models.read_text() == source


def test_an_output_over_the_source_of_a_module_spec_is_refused(models: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # The spec names the module (misuse_mod:broken, found in the current folder), not its file: --json onto that
    # file replaced the model's source with JSON (exit 0), which the next run could not import.
    source = tmp_path / "misuse_mod.py"
    source.write_text(models.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["misuse_mod:broken", "-i", "2,20", "--json", "misuse_mod.py"]) == 2
    assert one_line(capsys).startswith("layerprof: error: --json 'misuse_mod.py' is the model file this command "
                                       "reads; give the output another path")
    assert source.read_text() == models.read_text()


def test_model_code_that_exits_the_process_is_a_run_error(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # A training script whose argparse runs at import read the command's own arguments as its own and exited 2
    # ("unrecognized arguments", as if layerprof refused them); a factory calling sys.exit(3) exited 3 (the
    # status of an unreadable profile) with no word. Both escaped the command's handling of the model's errors.
    script = tmp_path / "train_script.py"
    script.write_text("import sys\nimport torch\nsys.exit(2)\n")
    factory = tmp_path / "exits.py"
    factory.write_text("import sys\n\n\ndef build():\n    sys.exit(3)\n")
    for spec, what in ((f"{script}:build", f"importing '{script}'"), (f"{factory}:build", "calling build()")):
        assert main([spec, "-i", "2,8"]) == 5
        assert one_line(capsys).startswith(f"layerprof: error: {what} raised SystemExit(")


def test_an_output_that_cannot_be_put_in_place_is_a_run_error_and_undoes_the_others(
        models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # An existing file that cannot be replaced (another user's in a sticky folder, an immutable one) was an
    # internal error (exit 70) naming a temporary file; then a run error that left the outputs renamed before it in
    # place. It is the run's error, naming the flag, and the outputs put in place before it are undone: an old file
    # is back as it was, a new one is gone.
    import layerprof._files as files_module

    found = files_module.move_into_place

    def refuses_json(temporary: Path, path: Path) -> None:
        if path == tmp_path / "p.json":  # (not the temporary file to_json writes through)
            raise PermissionError(1, "Operation not permitted")
        found(temporary, path)

    monkeypatch.setattr(files_module, "move_into_place", refuses_json)
    (tmp_path / "p.csv").write_text("old csv\n")
    (tmp_path / "p.json").write_text("{}")
    argv = [f"{models}:Net", "-i", "2,20", "--steps", "1", "--warmup", "0", "--csv", str(tmp_path / "p.csv"),
            "--html", str(tmp_path / "p.html"), "--json", str(tmp_path / "p.json")]
    assert main(argv) == 5
    assert one_line(capsys) == (f"layerprof: error: writing --json '{tmp_path / 'p.json'}': cannot put it in place "
                                "(Operation not permitted); no output file was written (those put in place before it "
                                "were undone)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "p.json"]  # (no temporary file, no p.html)
    assert (tmp_path / "p.csv").read_text() == "old csv\n"
    assert (tmp_path / "p.json").read_text() == "{}"


def test_a_plot_metric_whose_meter_runs_is_accepted(models: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.svg"
    argv = [f"{models}:Net", "-i", "2,20", "--steps", "1", "--warmup", "0", "--plot", str(path), "--plot-metric",
            "params"]  # params is a default meter
    assert main(argv) == 0, capsys.readouterr().err
    assert path.read_text().startswith("<?xml")


def test_a_memory_plot_with_the_live_memory_meter(models: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # live_memory is the memory meter with more: it gives what a memory plot needs (asking for both is refused)
    path = tmp_path / "p.svg"
    argv = [f"{models}:Net", "-i", "2,20", "--steps", "1", "--warmup", "0", "--metrics", "live_memory", "--plot",
            str(path), "--plot-metric", "memory"]
    assert main(argv) == 0, capsys.readouterr().err
    assert path.read_text().startswith("<?xml")


def test_a_roofline_plot_with_the_flops_meter(models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(layerprof.profile, "measure_peaks", lambda *args, **kwargs: {"flops": 1e11, "bandwidth": 1e10})
    path = tmp_path / "p.svg"
    argv = [f"{models}:Net", "-i", "2,20", "--steps", "2", "--metrics", "flops", "--plot", str(path), "--plot-kind",
            "roofline"]
    assert main(argv) == 0, capsys.readouterr().err
    assert 'id="roof:memory"' in path.read_text()


def test_an_absurd_input_is_one_line(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"{models}:broken", "-i", "2,20", "-i", "100000,100000,100000", "--steps", "1"]) == 2
    err = one_line(capsys)
    assert err.startswith("layerprof: error: --input 100000x100000x100000: the inputs need ")
    assert err.endswith(" of memory on cpu; give smaller shapes")


def test_an_input_that_cannot_be_made_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory\nException raised from ... (C++ frames)")

    monkeypatch.setattr(torch, "randn", out_of_memory)
    with pytest.raises(RunError) as info:
        make_inputs([parse_input("1000,1000")])
    assert str(info.value) == ("cannot make the input 1000x1000 (3.81 MiB): RuntimeError: DefaultCPUAllocator: "
                               "can't allocate memory")


def test_outputs_are_all_or_nothing(models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.json").write_text("old")

    def fails(self: layerprof.Profile, path: str, *args: object) -> str:
        Path(path).write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layerprof.Profile, "to_html", fails)
    argv = [f"{models}:Net", "-i", "2,20", "--steps", "1", "--csv", str(tmp_path / "p.csv"), "--json",
            str(tmp_path / "old.json"), "--html", str(tmp_path / "p.html"), "--trace", str(tmp_path / "p.trace")]
    assert main(argv) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"layerprof: error: writing --html {str(tmp_path / 'p.html')!r} raised OSError: [Errno 28] No "
                       "space left on device; no output file was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # nothing new, no temporary file left
    assert (tmp_path / "old.json").read_text() == "old"  # and the old file untouched
    monkeypatch.undo()
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json", "p.csv", "p.html", "p.trace"]
    assert layerprof.load(tmp_path / "old.json").records["fc"].calls == 1


def test_debug_shows_the_traceback_of_a_run_error(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"{models}:broken", "-i", "2,20", "--debug"]) == 5
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and 'raise AssertionError("the model was built' in err
    assert err.strip().splitlines()[-1] == (
        "layerprof: error: calling broken() raised AssertionError: the model was built: options must be checked first")


def test_ctrl_c_while_torch_imports_is_quiet(tmp_path: Path) -> None:
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise KeyboardInterrupt  # as if Ctrl-C landed while torch imports\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    command = subprocess.run([sys.executable, "-m", "layerprof", "x:y", "-i", "2"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert (command.returncode, command.stdout, command.stderr) == (130, "", "layerprof: interrupted\n")
    # the console script: what pip writes as bin/layerprof
    script = tmp_path / "bin" / "layerprof"
    script.parent.mkdir()
    script.write_text("import sys\nfrom layerprof.cli import main\nsys.exit(main())\n")
    console = subprocess.run([sys.executable, str(script), "x:y", "-i", "2"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert (console.returncode, console.stdout, console.stderr) == (130, "", "layerprof: interrupted\n")
    # a program that imports layerprof gets its KeyboardInterrupt as usual
    library = subprocess.run([sys.executable, "-c", "import layerprof"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert library.returncode != 0 and library.stderr.strip().endswith("KeyboardInterrupt")


def test_ctrl_c_while_layerprof_imports_after_torch_is_quiet(tmp_path: Path) -> None:
    # The package's own imports after torch (about 0.2 s of a 1.5 s start) were not covered: a Ctrl-C there printed
    # a traceback. A finder raises KeyboardInterrupt as layerprof.benchmark is imported, for the console script.
    script = tmp_path / "bin" / "layerprof"
    script.parent.mkdir()
    script.write_text(
        "import importlib.abc, sys\n"
        "class Hit(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'layerprof.benchmark':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Hit())\n"
        "from layerprof.cli import main\n"
        "sys.exit(main())\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    console = subprocess.run([sys.executable, str(script), "x:y", "-i", "2"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert (console.returncode, console.stdout, console.stderr) == (130, "", "layerprof: interrupted\n")


def test_outputs_onto_a_link_a_device_or_a_fifo_write_through_them(models: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # Written to a temporary file and renamed into place, an output replaced whatever node was at its path: run as
    # root, `--json /dev/null` made /dev/null a regular file; a link became a file and its target was never written.
    import stat
    import threading

    target = tmp_path / "target.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to("target.json")
    assert main([f"{models}:Net", "-i", "2,20", "--json", str(link), "--depth", "0"]) == 0
    assert link.is_symlink() and layerprof.load(target).tree.type == "Net"
    profile = layerprof.load(target)
    # A FIFO: the finished file is copied through to its reader, and the FIFO stays one.
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    profile.to_json(fifo)
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and layerprof.loads(received[0].decode()).tree.type == "Net"
    # A device node (a private /dev/null: making one needs root; where it cannot be made, the FIFO above stands in).
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return
    assert main([f"{models}:Net", "-i", "2,20", "--csv", str(node), "--depth", "0"]) == 0
    profile.to_json(node)
    assert stat.S_ISCHR(os.stat(node).st_mode) and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_output_onto_a_descriptor_appends_to_what_it_is(models: Path, tmp_path: Path) -> None:
    # /dev/fd/1 (as /dev/stdout) resolved to the pipe's pseudo-name ("cannot write in folder '/proc/.../fd'"), or to
    # the file the shell opened, which the finished output then replaced: a >> log lost its earlier lines. (/dev/fd/1
    # is tested, not /dev/stdout: on a regression it fails to write instead of replacing a system link, as root.)
    log = tmp_path / "run.log"
    log.write_text("earlier line\n")
    with open(log, "ab") as stdout:
        done = subprocess.run([sys.executable, "-m", "layerprof", f"{models}:Net", "-i", "2,20", "--depth", "0",
                               "--json", "/dev/fd/1"], stdout=stdout, stderr=subprocess.PIPE, text=False, timeout=120)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert text.startswith("earlier line\nNet from ") and text.count('"format": "layerprof.profile"') == 1
    piped = subprocess.run([sys.executable, "-m", "layerprof", f"{models}:Net", "-i", "2,20", "--depth", "0",
                            "--json", "/dev/fd/1"], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and '"format": "layerprof.profile"' in piped.stdout, piped.stderr


def _staged(folder: Path, name: str, text: str) -> tuple[Path, Path]:
    """A finished temporary file beside ``folder / name`` holding ``text``, and that target."""
    from layerprof._files import temporary_beside

    temporary = temporary_beside(folder / name)
    temporary.write_text(text)
    return temporary, folder / name


def _refusing(found: Any, refused: list[Path]) -> Any:
    """``move_into_place`` that refuses to put ``c.txt`` in place (noting it in ``refused``), and hands every other
    file to ``found``."""
    def refuses(temporary: Path, target: Path) -> None:
        if target.name == "c.txt":
            refused.append(target)
            raise PermissionError(1, "Operation not permitted")
        found(temporary, target)

    return refuses


def test_moving_files_into_place_all_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import layerprof._files as files_module
    from layerprof._files import MoveError, move_all_into_place

    staged = functools.partial(_staged, tmp_path)

    (tmp_path / "a.txt").write_text("old a")
    move_all_into_place([staged("a.txt", "new a"), staged("b.txt", "new b")])
    assert (tmp_path / "a.txt").read_text() == "new a" and (tmp_path / "b.txt").read_text() == "new b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]  # (no kept link, no temporary)

    refuses = _refusing(files_module.move_into_place, [])
    monkeypatch.setattr(files_module, "move_into_place", refuses)
    pairs = [staged("a.txt", "newer a"), staged("new.txt", "made"), staged("c.txt", "c")]
    with pytest.raises(MoveError) as caught:
        move_all_into_place(pairs)
    assert (caught.value.index, caught.value.restored, caught.value.strerror) == (2, True, "Operation not permitted")
    assert (tmp_path / "a.txt").read_text() == "new a"  # the old file back, the new one gone
    for temporary, _ in pairs:
        temporary.unlink(missing_ok=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]

    # A FIFO (written through, which cannot be undone) goes last: a refused file before it leaves it unwritten.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    opened: list[str] = []
    monkeypatch.setattr(files_module, "move_into_place",
                        lambda temporary, target: opened.append(target.name) if target == fifo else refuses(
                            temporary, target))
    pairs = [staged("pipe", "x"), staged("c.txt", "c")]
    with pytest.raises(MoveError) as caught:
        move_all_into_place(pairs)
    assert caught.value.index == 1 and opened == []
    for temporary, _ in pairs:
        temporary.unlink(missing_ok=True)


def test_an_undo_that_fails_keeps_the_old_file_and_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A failed undo deleted the only copy of the old file; an old file that cannot be kept (unreadable, hard links
    # protected) refused the whole write; a device written through before the failure was not named.
    import layerprof._files as files_module
    from layerprof._files import MoveError, move_all_into_place

    staged = functools.partial(_staged, tmp_path)

    found_move, found_replace = files_module.move_into_place, os.replace
    refused: list[Path] = []
    refuses = _refusing(found_move, refused)

    def no_undo(source: Any, target: Any) -> None:
        if refused:  # (the undo, after c.txt was refused: a.txt's kept copy cannot go back)
            raise PermissionError(1, "Operation not permitted")
        found_replace(source, target)

    (tmp_path / "a.txt").write_text("old a")
    monkeypatch.setattr(files_module, "move_into_place", refuses)
    monkeypatch.setattr(files_module.os, "replace", no_undo)
    with pytest.raises(MoveError) as caught:
        move_all_into_place([staged("a.txt", "new a"), staged("c.txt", "c")])
    assert not caught.value.restored and len(caught.value.left) == 1
    kept = caught.value.left[0].split("the old one is at ")[1].strip("'")
    assert Path(kept).read_text() == "old a" and (tmp_path / "a.txt").read_text() == "new a"
    monkeypatch.setattr(files_module.os, "replace", found_replace)
    monkeypatch.setattr(files_module, "_keep", lambda final: None)  # an old file that cannot be kept
    (tmp_path / "b.txt").write_text("old b")
    with pytest.raises(MoveError) as caught:
        move_all_into_place([staged("b.txt", "new b"), staged("c.txt", "c")])
    assert caught.value.left == [f"{str(tmp_path / 'b.txt')!r} is the new file (the old one could not be kept)"]
    monkeypatch.setattr(files_module, "move_into_place", found_move)
    move_all_into_place([staged("b.txt", "newer b"), staged("d.txt", "d")])  # replaced all the same
    assert (tmp_path / "b.txt").read_text() == "newer b"
