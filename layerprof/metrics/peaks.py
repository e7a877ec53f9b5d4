"""The machine's roofs, measured: sustained matmul FLOP/s and memory bandwidth of a device, once per process.

``peaks()`` times a square matmul (FLOP/s, 1 MAC = 2 FLOPs) and a large copy (bandwidth: bytes read plus bytes
written, as ``metrics/bytes.py`` counts a copy) and keeps the best of a few repeats: a repeat slowed by another
process only loses. On CPU it runs with the current ``torch.get_num_threads()`` (a profile's own thread count
when measured for a profile), so a single-threaded profile is held against single-threaded roofs. It takes a
few hundred milliseconds and is cached per (device, dtype, threads); user-given peaks (a spec sheet) bypass it.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .._check import check_int, check_real

__all__ = ["peaks", "check_peaks", "PEAK_KEYS"]

PEAK_KEYS = ("flops", "bandwidth")
_CACHE: dict[tuple[str, str, int], dict[str, Any]] = {}
# Sizes: a matmul big enough to reach the kernel's sustained rate, buffers well past the last-level cache.
_MATMUL_SIZE = {"cpu": 512, "cuda": 8192}
_COPY_BYTES = {"cpu": 64 << 20, "cuda": 1 << 30}
_BUDGET_S = {"matmul": 0.08, "copy": 0.15}  # seconds per measurement, after one warm-up run: memory traffic
# of other processes disturbs the copy for longer stretches than CPU time slices disturb the matmul
_MAX_REPEATS = 100
_WINDOWS = 2


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _as_dtype(dtype: Any) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"peaks: unknown dtype {dtype!r}; pass a torch.dtype such as torch.float32")
    return found


def _as_device(device: Any) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:  # torch's message lists every device type it was built to know
        raise ValueError(f"peaks: device {device!r} is not a device: give 'cpu', 'cuda', 'cuda:1' or a "
                         "torch.device") from error


def _best_seconds(run: Callable[[], Any], sync: Callable[[], None], budget: float) -> float:
    """The fastest of a few timed runs (after a warm-up), within the time budget."""
    run()
    sync()
    best, spent, repeats = float("inf"), 0.0, 0
    while repeats < 3 or (spent < budget and repeats < _MAX_REPEATS):
        start = time.perf_counter()
        run()
        sync()
        elapsed = time.perf_counter() - start
        best, spent, repeats = min(best, elapsed), spent + elapsed, repeats + 1
    return best


def _measure(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    n = _MATMUL_SIZE.get(device.type, 2048)
    # Drawn from a generator of its own: measured when a profile is saved (``to_json``), the roofs must not move
    # the user's random stream (a run that saves its profile would draw other numbers after it than one that not).
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(dtype)
    b = torch.randn(n, n, device=device, generator=generator).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    elements = _COPY_BYTES.get(device.type, 256 << 20) // torch.empty((), dtype=dtype).element_size()
    source = torch.ones(elements, device=device, dtype=dtype)
    target = torch.empty_like(source)
    matmul_s = copy_s = float("inf")
    # Two windows of each, interleaved: a stretch in which other processes slow one window down is less
    # likely to cover both.
    for _ in range(_WINDOWS):
        matmul_s = min(matmul_s, _best_seconds(lambda: torch.mm(a, b, out=out), sync, _BUDGET_S["matmul"]))
        copy_s = min(copy_s, _best_seconds(lambda: target.copy_(source), sync, _BUDGET_S["copy"]))
    moved = 2 * source.numel() * source.element_size()  # read + write
    return {"flops": 2 * n**3 / matmul_s, "bandwidth": moved / copy_s}


def peaks(device: Any = None, dtype: Any = None, threads: int | None = None) -> dict[str, Any]:
    """Sustained matmul FLOP/s and memory bandwidth (bytes/s) of ``device`` (default: the current CUDA device,
    else the CPU) for ``dtype`` (default float32), measured once per process and cached. ``threads``: the CPU
    thread count to measure with (default: the current one).

    >>> roofs = peaks("cpu")
    >>> sorted(roofs)[:4], roofs["flops"] > 0, roofs is peaks("cpu")
    (['bandwidth', 'device', 'dtype', 'flops'], True, True)
    """
    device = _default_device() if device is None else _as_device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = _as_dtype(dtype)
    current = torch.get_num_threads()
    threads = check_int("peaks: threads", threads, minimum=1, none=True)
    threads = current if threads is None or device.type != "cpu" else threads
    key = (str(device), str(dtype), threads if device.type == "cpu" else 0)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    started = time.perf_counter()
    if threads != current:
        torch.set_num_threads(threads)
    try:
        measured = _measure(device, dtype)
    finally:
        if threads != current:
            torch.set_num_threads(current)
    measured.update(device=str(device), dtype=str(dtype).replace("torch.", ""), threads=threads,
                    source="measured", seconds=time.perf_counter() - started)
    _CACHE[key] = measured
    return measured


def check_peaks(value: Any) -> dict[str, Any] | None:
    """User-given peaks, checked: a dict with positive ``flops`` (FLOP/s) and ``bandwidth`` (bytes/s)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"peaks must be a dict such as {{'flops': 989e12, 'bandwidth': 3.35e12}}, got {value!r}")
    missing = [key for key in PEAK_KEYS if key not in value]
    if missing:
        raise ValueError(f"peaks needs {' and '.join(repr(k) for k in missing)} (FLOP/s and bytes/s), got {value!r}")
    for key in PEAK_KEYS:
        check_real(f"peaks[{key!r}]", value[key], "a positive finite number",  # ("1e12", a string, is no number)
                   lambda number: 0 < number < float("inf"))
    source = value.get("source", "given")
    if not isinstance(source, str):
        raise TypeError(f"peaks['source'] says where the figures come from, a string such as 'datasheet'; got "
                        f"{source!r}")
    return {**value, "flops": float(value["flops"]), "bandwidth": float(value["bandwidth"]), "source": source}
