"""Writing files all-or-nothing: into a temporary file beside the target, renamed onto it only when complete, so
that a failure (or Ctrl-C) half way leaves the old file, or none, and never a partial one."""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["destination", "is_special", "temporary_beside", "move_into_place", "move_all_into_place", "MoveError",
           "write_text_atomic"]


def _names_a_descriptor(path: Path) -> bool:
    """``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1`` and the like: links to a process's open descriptor, which
    resolve to a pipe's pseudo-name or to the file the shell opened (a rename there would replace the file instead
    of writing into it, and an appending ``>>`` would lose what came before)."""
    text = os.path.abspath(path)
    return text in ("/dev/stdout", "/dev/stderr") or text.startswith(("/dev/fd/", "/proc/self/fd/")) or (
        text.startswith("/proc/") and "/fd/" in text)


def destination(path: Path) -> Path:
    """Where writing ``path`` lands: the file a symbolic link points to (the link stays a link, and its target gets
    the file), else ``path`` (a process's descriptor, such as ``/dev/stdout``, as it is)."""
    return Path(os.path.realpath(path)) if os.path.islink(path) and not _names_a_descriptor(path) else path


def is_special(path: Path) -> bool:
    """Whether ``path`` is an existing node other than a regular file or a folder (a device such as ``/dev/null``, a
    FIFO, a socket), or a process's descriptor (``/dev/stdout``). Renaming a finished file onto it would replace the
    node itself (``/dev/null`` made a regular file, as root): it is written through instead, appended once the file
    is complete."""
    if _names_a_descriptor(path):
        return os.path.exists(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def temporary_beside(path: Path) -> Path:
    """A new empty file in ``path``'s folder (a symbolic link's target's), hidden, with the same suffix (writers
    pick a format by suffix). An error names ``path`` and its folder, not the temporary file, which the caller never
    asked for."""
    path = destination(path)
    if is_special(path):  # copied through at the end (``move_into_place``): staged where files can be made
        handle, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
        os.close(handle)
        return Path(name)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; give the path of a file in it")
    folder = path.parent
    if not folder.is_dir():
        kind = NotADirectoryError if folder.exists() else FileNotFoundError
        shown = "is not a folder" if folder.exists() else "does not exist: create it first"
        raise kind(f"cannot write {str(path)!r}: {str(folder)!r} {shown}")
    try:
        handle, name = tempfile.mkstemp(dir=folder, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
    except OSError as error:
        raise type(error)(error.errno, f"cannot write {str(path)!r} in folder {str(folder)!r} ({error.strerror})"
                          ) from None
    os.close(handle)
    return Path(name)


def move_into_place(temporary: Path, target: Path) -> None:
    """Rename the finished ``temporary`` onto ``target`` (a symbolic link's target), with the mode a plain write
    would have given it; onto a device or FIFO, copy it through instead (``is_special``)."""
    target = destination(target)
    if is_special(target):
        with open(temporary, "rb") as source, open(target, "ab") as sink:  # ("ab": after what the shell's >> holds)
            shutil.copyfileobj(source, sink)
        temporary.unlink(missing_ok=True)
        return
    if target.exists():
        mode = target.stat().st_mode & 0o777  # replacing a file keeps its permissions
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # mkstemp makes 0600; a new file gets the usual mode
    os.chmod(temporary, mode)
    os.replace(temporary, target)


class MoveError(OSError):
    """``move_all_into_place`` could not put one file in place: ``index`` is its position, and ``restored`` says
    whether every file moved before it is as it was again (the old file back, or none where there was none)."""

    def __init__(self, index: int, cause: OSError, restored: bool) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.index, self.cause, self.restored = index, cause, restored


def move_all_into_place(pairs: list[tuple[Path, Path]]) -> None:
    """``move_into_place`` for each ``(temporary, target)``, all or none: where one cannot be put in place (an
    existing file that cannot be replaced), those moved before it are undone (each old file put back from a hard link
    kept beside it, each new one removed) and ``MoveError`` says which one failed. Devices and FIFOs, which are
    written through and cannot be undone, go last (their order among themselves kept)."""
    order = sorted(range(len(pairs)), key=lambda i: is_special(destination(pairs[i][1])))
    undo: list[tuple[Path, Path | None]] = []  # (target, the old file's kept link, or None where there was none)
    try:
        for index in order:
            temporary, target = pairs[index]
            final = destination(target)
            kept = None
            try:
                if not is_special(final) and final.exists():
                    kept = temporary_beside(final)
                    kept.unlink()
                    try:
                        os.link(final, kept)
                    except OSError:  # a file system without hard links: a copy
                        shutil.copy2(final, kept)
                move_into_place(temporary, target)
            except OSError as error:
                if kept is not None:
                    kept.unlink(missing_ok=True)
                raise MoveError(index, error, _undo(undo)) from error
            if not is_special(final):
                undo.append((final, kept))
    finally:
        for _, kept in undo:
            if kept is not None:
                kept.unlink(missing_ok=True)


def _undo(moved: list[tuple[Path, Path | None]]) -> bool:
    """Put back what ``move_all_into_place`` replaced, last first; whether all of it went back."""
    restored = True
    for target, kept in reversed(moved):
        try:
            if kept is None:
                target.unlink()
            else:
                os.replace(kept, target)
        except OSError:
            restored = False
    return restored


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``: complete, or not at all."""
    target = Path(path)
    temporary = temporary_beside(target)
    try:
        temporary.write_text(text, encoding="utf-8")
        move_into_place(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
