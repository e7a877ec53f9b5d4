"""A second reading of the comparison tables, tensor-parallel counting, the roofline of modules run in some steps
only and the warnings and refusals that came with them: each test fails on the code before its fix."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

import layerprof

from .test_distributed_more import Net  # fc1 Linear(8, 16), ReLU, fc2 Linear(16, 4)


@contextlib.contextmanager
def _fake_group(world_size: int = 2) -> Iterator[None]:
    """A process group of ``world_size`` ranks in this process, rank 0 (torch's fake backend: collectives do
    nothing), for DTensor's sharding without spawning ranks."""
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_bytes_are_the_ranks_shards_as_its_flops_are() -> None:
    """Under parallelize_module, FLOPs were each rank's shards but bytes the whole model's (fc1 960 bytes forward
    on each of 2 ranks, as unsharded), so the roofline set half the FLOPs against all the bytes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    with _fake_group():
        torch.manual_seed(0)
        model = Net()
        parallelize_module(model, init_device_mesh("cpu", (2,)), {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        with layerprof.LayerProf(model, metrics=("flops",)) as prof:
            for _ in range(2):
                model(torch.randn(4, 8)).sum().backward()
                prof.step()
    fc1, fc2 = prof.records["fc1"], prof.records["fc2"]
    # fc1 (ColwiseParallel) on rank 0: addmm reads its bias shard (8 floats), the whole input x [4, 8] and its
    # weight shard [8, 8]; writes its output shard [4, 8]: 4 * (8 + 32 + 64 + 32) = 544 bytes (unsharded: 960).
    assert (fc1.flops_forward, fc1.bytes_forward) == (512, 544)
    # fc2 (RowwiseParallel): addmm reads bias (4, replicated), input shard [4, 8], weight shard [4, 8], and writes
    # a partial sum [4, 4] (all of it, on each rank): 4 * (4 + 32 + 32 + 16) = 336 bytes; mm's 16 + 32 + 32.
    assert (fc2.flops_forward, fc2.bytes_forward) == (256, 336)


class _Aux(nn.Module):
    """``aux`` runs in steps 0, 4 and 8 only: the counted step (0) and 2 of the 8 timed steps."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.aux = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        y = self.a(x)
        return self.aux(y) if step % 4 == 0 else y


@pytest.fixture(scope="module")
def aux_profile() -> layerprof.LayerProf:
    torch.manual_seed(0)
    model = _Aux()
    with layerprof.LayerProf(model, metrics=("flops",), peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
        for step in range(9):
            model(torch.randn(32, 64), step).sum().backward()
            prof.step()
    return prof


def test_the_roofline_plots_legend_adds_up_each_modules_time_per_step(aux_profile) -> None:
    """The legend sums each bound's modules' time in a step, and a point's area is its time: for a module run in
    some steps only they read its time in a step that ran it (aux's self time 4 times over: it ran in 2 of 8), so the
    legend's times added up to more than the modules take per step. Its FLOP/s stays over the steps that ran it."""
    import matplotlib

    matplotlib.use("Agg")
    from layerprof.record.fields import FIELDS
    from layerprof.render.plot_roofline import roofline_points
    from layerprof.render.units import format_ms

    aux = aux_profile.records["aux"]
    assert (aux.steps_run, aux.steps) == (2, 8)
    per_step = FIELDS["self_total_ms"].value(aux)
    point = next(p for p in roofline_points(aux_profile.profile.tree) if p["name"] == "aux")
    assert point["ms"] == pytest.approx(4 * per_step) and point["step_ms"] == pytest.approx(per_step)
    assert point["flop_per_s"] == pytest.approx(aux.self_flops / (4 * per_step / 1000.0))
    ax = layerprof.plot_roofline(aux_profile)
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    line = next(text for text in legend if text.startswith(f"{point['bound']}-bound: "))
    shown = [p for p in roofline_points(aux_profile.profile.tree) if p["bound"] == point["bound"]]
    assert line.endswith(", " + format_ms(sum(FIELDS["self_total_ms"].value(aux_profile.records[p["name"]])
                                               for p in shown)))


def _mlp(width: int) -> layerprof.Profile:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))
    with layerprof.LayerProf(net, metrics=("params",)) as prof:
        net(torch.randn(4, 8)).sum().backward()
    return prof.profile


@pytest.mark.parametrize("method", ["to_markdown", "to_latex", "to_csv"])
def test_a_modules_table_of_a_comparison_without_fields_per_module_is_refused(method: str) -> None:
    """compare(..., module_fields=[]) holds no field per module: level='modules' wrote a table without a column
    ('|  |' and '||' in Markdown, a LaTeX tabular{} that does not compile, an empty CSV line)."""
    comparison = layerprof.compare(_mlp(16), _mlp(8), module_fields=[])
    with pytest.raises(ValueError, match=r"level='modules': this comparison holds no field per module "
                                         r"\(compared with module_fields=\[\]\)"):
        getattr(comparison, method)(level="modules")
    assert getattr(comparison, method)().splitlines()[0].lower().startswith(("| metric", "metric", "\\begin"))
    assert "Modules with the largest change" not in str(comparison)  # (the printed comparison leaves them out)
