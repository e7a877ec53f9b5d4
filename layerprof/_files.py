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
    """``move_all_into_place`` could not put one file in place: ``index`` is its position. ``restored``: every file
    moved before it is as it was again (the old file back, or none where there was none); else ``left`` says, for
    each one that is not, what is where. ``through``: the positions of the devices and FIFOs written through before
    it, which no undo can take back."""

    def __init__(self, index: int, cause: OSError, left: list[str], through: list[int]) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.index, self.cause, self.left, self.through = index, cause, left, through
        self.restored = not left


def move_all_into_place(pairs: list[tuple[Path, Path]]) -> None:
    """``move_into_place`` for each ``(temporary, target)``, all or none: where one cannot be put in place (an
    existing file that cannot be replaced), those moved before it are undone (each old file put back from a hard link,
    or a copy, kept beside it; each new one removed) and ``MoveError`` says which one failed. Devices and FIFOs, which
    are written through and cannot be undone, go last (their order among themselves kept). An old file that cannot
    be kept (unreadable, no hard links) is replaced all the same, and named if an undo would need it."""
    if len(pairs) == 1:  # (nothing to undo)
        try:
            move_into_place(*pairs[0])
        except OSError as error:
            raise MoveError(0, error, [], []) from error
        return
    order = sorted(range(len(pairs)), key=lambda i: is_special(destination(pairs[i][1])))
    undo: list[tuple[Path, Path | None, bool]] = []  # (target, the old file's kept copy, whether one existed)
    through: list[int] = []
    left: list[str] = []
    try:
        for index in order:
            temporary, target = pairs[index]
            final = destination(target)
            special = is_special(final)
            existed = not special and final.exists()
            kept = _keep(final) if existed else None
            try:
                move_into_place(temporary, target)
            except OSError as error:
                if kept is not None:
                    kept.unlink(missing_ok=True)
                left = _undo(undo)
                raise MoveError(index, error, left, through) from error
            if special:
                through.append(index)
            else:
                undo.append((final, kept, existed))
    finally:
        for _, kept, _ in undo:  # (the copies an undo put back are gone; one it could not put back is named)
            if kept is not None and not any(repr(str(kept)) in entry for entry in left):
                kept.unlink(missing_ok=True)


def _keep(final: Path) -> Path | None:
    """A hard link to ``final`` beside it (a copy where the file system has none), or None where neither can be
    made."""
    try:
        kept = temporary_beside(final)
    except OSError:
        return None
    kept.unlink()
    try:
        os.link(final, kept)
    except OSError:  # a file system without hard links, or one that protects them: a copy
        try:
            shutil.copy2(final, kept)
        except OSError:
            kept.unlink(missing_ok=True)
            return None
    return kept


def _undo(moved: list[tuple[Path, Path | None, bool]]) -> list[str]:
    """Put back what ``move_all_into_place`` replaced, last first; what could not be, each said."""
    left = []
    for target, kept, existed in reversed(moved):
        try:
            if not existed:
                target.unlink()
            elif kept is not None:
                os.replace(kept, target)
            else:
                left.append(f"{str(target)!r} is the new file (the old one could not be kept)")
        except OSError:
            left.append(f"{str(target)!r} is the new file" + (f", the old one is at {str(kept)!r}" if kept else ""))
    return left


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``: complete, or not at all."""
    target = Path(path)
    temporary = temporary_beside(target)
    try:
        temporary.write_text(text, encoding="utf-8")
        move_into_place(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
