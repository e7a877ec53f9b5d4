"""The cost of a minor page fault, timed on the host (plan/fault_cost.py)."""
from __future__ import annotations

import pytest

from layerprof.plan.fault_cost import page_fault_us

resource = pytest.importorskip("resource")  # Windows counts no page faults


def test_a_round_takes_a_fault_a_page_and_prices_it() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cost = page_fault_us(pages=512, repeats=3)
    taken = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert 3 * 512 <= taken < 3 * 512 + 200  # a fault for each fresh page written, three rounds (and a few besides)
    assert 0.05 < cost < 200  # µs: 1.5-4 on a 2-core virtual machine; a page's zeroing alone takes about 0.1


@pytest.mark.parametrize("argument", [dict(pages=0), dict(pages=True), dict(repeats=0), dict(repeats=1.5)])
def test_bad_counts_are_refused(argument: dict) -> None:
    with pytest.raises(ValueError, match=f"{next(iter(argument))} must be a positive int"):
        page_fault_us(**argument)
