"""Run a test worker on 2 CPU processes with gloo, and bring each rank's JSON result back to the test.

Made to survive a cold first run on a loaded machine (torch's imports in each spawned process can take tens of
seconds there): the group forms on a ``FileStore`` (no port to find free, nothing to race for), with a generous
timeout, only after the worker's module is imported (the spawn re-imports it, with every heavy import at its
top), and the ranks pass a barrier before the work starts. Each rank writes its result, or its traceback, to a
file under a fresh directory; a rank that died without writing one is reported with its exit code.
"""
from __future__ import annotations

import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GROUP_TIMEOUT_S = 300  # a collective waits this long for a rank still importing before it fails
DEADLINE_S = 600  # the whole run; a normal one takes seconds


def _rank_main(rank: int, world_size: int, store_path: str, out_dir: str, worker: Callable[[int], Any]) -> None:
    result: dict[str, Any]
    try:
        torch.set_num_threads(1)
        if os.path.exists("/sys/class/net/lo"):  # gloo on the loopback interface: no guessing among the host's NICs
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        try:
            dist.barrier()
            result = {"result": worker(rank)}
            dist.barrier()  # no rank tears the group down while another is still in the worker's last collective
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        result = {"error": traceback.format_exc()}
    path = Path(out_dir, f"rank{rank}.json")
    path.with_suffix(".tmp").write_text(json.dumps(result))
    path.with_suffix(".tmp").replace(path)


def run_ranks(worker: Callable[[int], Any], tmp_path: Path, world_size: int = 2) -> dict[int, Any]:
    """``worker(rank)`` on ``world_size`` spawned processes in one gloo group; ``{rank: what it returned}``
    (JSON-serializable). ``worker`` must be a module-level function of an importable module."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    store_path = str(tmp_path / "store")
    context = mp.start_processes(_rank_main, args=(world_size, store_path, str(out_dir), worker),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world_size}-rank gloo run did not finish in {DEADLINE_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
    results = {}
    for rank in range(world_size):
        path = out_dir / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result (exit code {context.processes[rank].exitcode})"
        result = json.loads(path.read_text())
        assert "error" not in result, f"rank {rank} failed:\n{result['error']}"
        results[rank] = result["result"]
    return results


__all__ = ["run_ranks", "GROUP_TIMEOUT_S"]
