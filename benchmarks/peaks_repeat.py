"""Repeatability and cost of ``layerprof.peaks()`` on this machine: one fresh process per measurement (the cache
is per process), one thread.

    python benchmarks/peaks_repeat.py [--runs 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

MEASURE = ("import json, torch; torch.set_num_threads(1); from layerprof.metrics.peaks import peaks; "
           "print(json.dumps(peaks('cpu')))")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    runs = []
    for _ in range(parser.parse_args().runs):
        out = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    for key in ("flops", "bandwidth", "seconds"):
        values = [run[key] for run in runs]
        middle = statistics.median(values)
        shown = ", ".join(f"{value:.3g}" for value in values)
        print(f"{key}: {shown}; median {middle:.3g}, (max - min) / median {100 * (max(values) - min(values)) / middle:.0f}%")


if __name__ == "__main__":
    main()
