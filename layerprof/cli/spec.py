"""Turn a model spec (``package.module:callable`` or ``path/to/file.py:callable``) into an ``nn.Module``."""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from .errors import RunError, UsageError, one_line

__all__ = ["load_model", "parse_kwargs", "spec_file", "split_spec"]


def parse_kwargs(text: str | None) -> dict[str, Any]:
    """The ``--kwargs`` JSON object as a dict; anything else is a UsageError."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--kwargs is not valid JSON ({exc.msg} at character {exc.pos}): {text}") from exc
    if not isinstance(value, dict):
        raise UsageError(f"--kwargs must be a JSON object such as '{{\"num_classes\": 10}}', got {text}")
    return value


def split_spec(spec: str) -> tuple[str, str]:
    """``'pkg.mod:Factory'`` -> ``('pkg.mod', 'Factory')``; the last colon splits, so ``C:\\m.py:f`` works."""
    where, colon, attribute = spec.rpartition(":")
    if not colon or not where or not attribute:
        raise UsageError(
            f"model spec {spec!r} needs the form package.module:callable or path/to/file.py:callable, "
            "e.g. torchvision.models:resnet18"
        )
    return where, attribute


def _is_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def spec_file(spec: str) -> Path | None:
    """The file a spec's model is read from: the one a ``path/to/file.py:callable`` spec names, or the source of a
    ``package.module:callable`` spec's module (None where there is none, or the spec does not read: ``load_model``
    says what is wrong with it)."""
    where, colon, attribute = spec.rpartition(":")
    if not (colon and where and attribute):
        return None
    return Path(where).expanduser() if _is_path(where) else _module_file(where)


def _module_file(where: str) -> Path | None:
    """The source file of module ``where``, found as ``_import_module`` imports it (the current folder on the
    path), without running it (its parent packages are imported); None where it is not found."""
    added = "" not in sys.path and os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(where)
    except Exception:  # noqa: BLE001 - a parent package that fails to import: load_model says so
        return None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    origin = getattr(found, "origin", None)
    return Path(origin) if isinstance(origin, str) and os.path.isfile(origin) else None


def _import_file(where: str) -> ModuleType:
    path = Path(where).expanduser()
    if not path.is_file():
        raise UsageError(f"model file {where!r} not found")
    name = f"_layerprof_spec_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {where!r} as Python: give a .py file")
    module = importlib.util.module_from_spec(spec)
    # The file may import its neighbours, as it would when run as a script.
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise RunError(_exits(f"importing {where!r}", exc)) from None
    except Exception as exc:
        raise RunError(f"importing {where!r} raised {one_line(exc)}") from exc
    return module


def _import_module(where: str) -> ModuleType:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: modules in the current directory resolve
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (where == missing or where.startswith(missing + ".")):
            raise UsageError(f"no module named {missing!r} (from the spec's module part {where!r})") from exc
        raise RunError(f"importing {where!r} failed: {one_line(exc)}; install the missing package") from exc
    except SystemExit as exc:
        raise RunError(_exits(f"importing {where!r}", exc)) from None
    except Exception as exc:
        raise RunError(f"importing {where!r} raised {one_line(exc)}") from exc


def _exits(what: str, exc: SystemExit) -> str:
    """What to say of a model's code that exits the process (``sys.exit``, or argparse refusing the command's own
    arguments, which it reads as the script's)."""
    return (f"{what} raised SystemExit({exc.code!r}): the model's code exits the process (a script that parses its "
            "arguments or trains when imported?); name a function that builds the model, and keep the script's own "
            "work under `if __name__ == \"__main__\":`")


def _in_submodules(where: str, attribute: str) -> list[str]:
    """The spec naming callable ``attribute`` in the least deep imported public submodule of package ``where``:
    ``timm:resnet18`` -> ``timm.models:resnet18`` (model factories live one level down in timm and torchvision)."""
    found = []
    for name, module in list(sys.modules.items()):
        if (name.startswith(where + ".") and isinstance(module, ModuleType) and callable(vars(module).get(attribute))
                and not any(part.startswith("_") for part in name.split("."))):
            found.append(name)
    return [f"{name}:{attribute}" for name in sorted(found, key=lambda name: (name.count("."), name))[:1]]


def _lookup(module: ModuleType, where: str, attribute: str) -> Any:
    value: Any = module
    for depth, part in enumerate(attribute.split(".")):
        try:
            value = getattr(value, part)
        except AttributeError:
            owner = ".".join([where] + attribute.split(".")[:depth]) if depth else where
            candidates = [name for name in dir(value) if not name.startswith("_")]
            close = difflib.get_close_matches(part, candidates, n=3)
            if not close and not depth and not _is_path(where):
                close = _in_submodules(where, part)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"{owner!r} has no attribute {part!r}{hint}") from None
    return value


def load_model(spec: str, kwargs: dict[str, Any] | None = None) -> nn.Module:
    """Import the spec's module, call its callable with ``kwargs`` and check that a Module came back.

    An ``nn.Module`` instance named by the spec is used as it is (``kwargs`` must then be empty).
    """
    kwargs = kwargs or {}
    where, attribute = split_spec(spec)
    module = _import_file(where) if _is_path(where) else _import_module(where)
    target = _lookup(module, where, attribute)
    if isinstance(target, nn.Module):
        if kwargs:
            raise UsageError(f"{spec!r} is already a module instance: it takes no --kwargs")
        return target
    if not callable(target):
        raise UsageError(f"{spec!r} is not callable (it is of type {type(target).__name__}): "
                         "name a class or a function that returns an nn.Module")
    shown = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
    try:
        model = target(**kwargs)
    except SystemExit as exc:
        raise RunError(_exits(f"calling {attribute}({shown})", exc)) from None
    except Exception as exc:
        raise RunError(f"calling {attribute}({shown}) raised {one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"{spec!r} returned {type(model).__module__}.{type(model).__qualname__}, not a torch.nn.Module"
        )
    return model
