"""The overhead benchmark's orders of the twin's variants (benchmarks/overhead.py): a balanced design, so that no
variant runs more often than another right after a given one (a step carries over what the one before it left)."""
from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.overhead import balanced_orders


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6, 7])
def test_each_variant_comes_first_and_follows_each_other_equally_often(count: int) -> None:
    keys = [f"variant{index}" for index in range(count)]
    orders = balanced_orders(keys)
    # n orders for an even count, 2n (the square and its mirror) for an odd one
    assert len(orders) == (count if count % 2 == 0 else 2 * count)
    assert all(sorted(order) == sorted(keys) for order in orders)
    per_cycle = len(orders) // count  # times each key is first, and times each ordered pair is adjacent
    assert Counter(order[0] for order in orders) == {key: per_cycle for key in keys}
    follows = Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert follows == {(a, b): per_cycle for a in keys for b in keys if a != b}


def test_the_benchmarks_five_variants_balance_over_its_thirty_rounds() -> None:
    # plain, one-shot, one-shot + read, the seed tool's hooks, torch.profiler: 10 orders, 30 rounds = 3 cycles.
    keys = ["plain", "layerprof_oneshot", "layerprof_oneshot_read", "full_backward_hooks", "torch_profiler_stack"]
    orders = balanced_orders(keys)
    rounds = [orders[index % len(orders)] for index in range(30)]
    after_peers = Counter(b for order in rounds for a, b in zip(order, order[1:])
                          if a in ("full_backward_hooks", "torch_profiler_stack"))
    assert after_peers["plain"] == after_peers["layerprof_oneshot"] == 12  # 2 peers x 2 a cycle x 3 cycles
    assert balanced_orders(keys) == orders  # seeded: the same orders in every run
