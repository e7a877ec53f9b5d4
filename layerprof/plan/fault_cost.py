"""The cost of a minor page fault on this host: what a fresh page from the system costs a step.

A checkpoint plan can change how many fresh pages the allocator takes from the system in a step: ALBERT's one
wrapper around its encoder takes 2,500-4,500 more a step in backward (glibc grows its heap for the recomputation
and trims it back before the next step), and plans that free much often take fewer. Which plans do that is not
predictable from the profile (the same wrapper around BERT's encoder holds as many live bytes at its peak, to
0.3 MiB, and takes none; ``BENCHMARKS.md``), so the planner leaves it out; ``verify_plan`` counts the faults and
prices them with this figure, so that a user can tell a miss of that kind from a wrong prediction.

``page_fault_us()`` maps fresh anonymous pages and writes one byte in each, twice: the first pass takes a fault a
page, the second none, and their difference over the pages, in thread CPU time, is the cost of a fault (the kernel
finding and zeroing a page, and the trap). The least first pass of ``repeats`` rounds of ``pages`` pages less
the least second pass; about 5 ms a round for 2,048 pages on a 2-core virtual machine, where it reads 1.1-2.5 µs a
fault.

>>> 0 < page_fault_us(pages=64, repeats=1) < 1e4
True
"""
from __future__ import annotations

import mmap
import time

import torch

__all__ = ["page_fault_us", "PAGE_BYTES"]

PAGE_BYTES = mmap.PAGESIZE


def page_fault_us(pages: int = 2048, repeats: int = 5) -> float:
    """The cost of a minor page fault, µs, from ``repeats`` rounds of ``pages`` fresh pages (the least of each
    pass)."""
    if isinstance(pages, bool) or not isinstance(pages, int) or pages < 1:
        raise ValueError(f"pages must be a positive int, got {pages!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    rounds = [_round(pages) for _ in range(repeats)]
    # The least of each pass over the rounds: noise (a preempted vCPU, another tenant) only adds time, and a
    # burst in a few rounds can move a median of their differences (to 0 where it falls in the second passes).
    faulted, again = min(first for first, _ in rounds), min(second for _, second in rounds)
    return max(0.0, faulted - again) / pages * 1e6


def _round(pages: int) -> tuple[float, float]:
    """One round: a fresh mapping written a byte a page, first with faults and then without (seconds of each)."""
    mapping = mmap.mmap(-1, pages * PAGE_BYTES)
    try:
        one_a_page = torch.frombuffer(mapping, dtype=torch.uint8)[::PAGE_BYTES]
        start = time.thread_time()
        one_a_page.fill_(1)
        faulted = time.thread_time()
        one_a_page.fill_(2)
        again = time.thread_time()
        del one_a_page  # the mapping cannot close while a tensor still views it
    finally:
        mapping.close()
    return faulted - start, again - faulted
