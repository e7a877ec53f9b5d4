"""Model families outside vision and language transformers, trained as their users train them: neural ODEs with
the adjoint method (torchdiffeq), graph networks (PyTorch Geometric), reinforcement-learning loops. Each optional
package's tests skip where it is not installed."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from layerprof import LayerProf

from .invariants import check_truth, count_calls

TOLERANCE_MS = 1e-6


def self_backward_total(prof: LayerProf) -> float:
    return sum(record.self_backward_ms or 0.0 for record in prof.records.values())


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [parameter.grad for parameter in model.parameters()]


# -- a module re-run by an autograd.Function's backward, with a backward pass through its graph there -------------

class ReentrantBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=True)


def test_reentrant_checkpoint_backward_of_the_rerun_is_not_the_callers_self_time() -> None:
    # Reentrant checkpointing re-runs `inner` in the backward of the block's node, then runs a backward pass through
    # the re-run graph there: that pass is inner's backward, inside the block's, and no longer in the block's self.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 32), ReentrantBlock(), nn.Linear(32, 1))
    x = torch.randn(16, 32, requires_grad=True)
    with LayerProf(net) as prof:
        for _ in range(3):
            net(x).sum().backward()
            prof.step()
    block, inner = prof.records["1"], prof.records["1.inner"]
    assert inner.recompute_ms > 0 and inner.backward_ms > 0 and inner.calls == 1
    assert inner.backward_ms <= block.backward_ms + TOLERANCE_MS
    assert block.self_backward_ms <= block.backward_ms - inner.backward_ms + TOLERANCE_MS
    # Self times add up to the root's backward, each instant once (inner's nodes were counted twice before).
    assert self_backward_total(prof) == pytest.approx(prof.tree.backward_ms, rel=1e-9, abs=TOLERANCE_MS)
    check_truth(prof, net)


# -- neural ODEs: torchdiffeq's odeint_adjoint calls the function's forward inside backward -------------------

class Dynamics(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(y)


class ODEBlock(nn.Module):
    """y(1) of dy/dt = f(y) from y0 by 10 steps of RK4 (4 evaluations a step), then a linear head."""

    def __init__(self, adjoint: bool) -> None:
        super().__init__()
        self.func, self.head, self.adjoint = Dynamics(), nn.Linear(4, 2), adjoint

    def forward(self, y0: torch.Tensor) -> torch.Tensor:
        torchdiffeq = pytest.importorskip("torchdiffeq")
        solve = torchdiffeq.odeint_adjoint if self.adjoint else torchdiffeq.odeint
        times = torch.tensor([0.0, 1.0])
        return self.head(solve(self.func, y0, times, method="rk4", options={"step_size": 0.1})[-1])


EVALUATIONS = 40  # 10 steps x 4 stages
BATCH = 8
# One evaluation: two Linears, 2 * 8 * 4 * 16 FLOPs each.
EVALUATION_FLOPS = 2 * (2 * BATCH * 4 * 16)


@pytest.mark.parametrize("adjoint", [True, False], ids=["adjoint", "direct"])
def test_neural_ode_outputs_grads_calls_flops_and_self_times(adjoint: bool) -> None:
    pytest.importorskip("torchdiffeq")
    torch.manual_seed(0)
    model = ODEBlock(adjoint)
    reference = copy.deepcopy(model)
    y0 = torch.randn(BATCH, 4)
    expected = reference(y0)
    expected.sum().backward()
    with count_calls(model) as counts, LayerProf(model, metrics=("flops",)) as prof:
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            output = model(y0)
            output.sum().backward()
            prof.step()
    assert torch.equal(output, expected)
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(grads(model), grads(reference)))
    func, head, root = prof.records["func"], prof.records["head"], prof.tree
    assert func.calls == EVALUATIONS and prof.records["func.net.0"].calls == EVALUATIONS
    assert func.flops_forward == EVALUATIONS * EVALUATION_FLOPS
    if adjoint:
        # The adjoint pass evaluates f again, backward in time, inside the backward of the root's node: those
        # evaluations are re-runs (recompute, FLOPs apart), not calls, and their vector-Jacobian products are f's
        # backward (two products per Linear: input and weight gradients).
        assert counts["func"] == 2 * 3 * EVALUATIONS  # the reference counts every forward, re-runs included
        assert func.recompute_ms > 0 and func.flops_recompute == EVALUATIONS * EVALUATION_FLOPS
        assert func.flops_backward == 2 * EVALUATIONS * EVALUATION_FLOPS
    else:
        assert counts["func"] == 3 * EVALUATIONS
        assert func.recompute_ms is None and func.flops_recompute is None
        # The first evaluation's input y0 needs no gradient: its first Linear skips one product (2 * 8 * 4 * 16).
        assert func.flops_backward == 2 * EVALUATIONS * EVALUATION_FLOPS - 2 * BATCH * 4 * 16
    assert head.flops_forward == 2 * BATCH * 4 * 2
    assert root.flops_backward == func.flops_backward + 2 * head.flops_forward
    assert func.backward_ms > 0 and func.backward_ms <= root.backward_ms + TOLERANCE_MS
    # Each instant of the backward in one self time: f's own backward is not the root's as well.
    assert self_backward_total(prof) == pytest.approx(root.backward_ms, rel=1e-9, abs=TOLERANCE_MS)
    check_truth(prof, model)
    assert not any(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                   for module in model.modules())


# -- graph networks: PyTorch Geometric, message passing as gather + scatter, or as a sparse product -------------

NODES, EDGES, FEATURES, HIDDEN, CLASSES = 30, 120, 8, 16, 3


def random_graph(nodes: int = NODES, edges: int = EDGES) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(nodes, FEATURES, generator=generator),
            torch.randint(0, nodes, (2, edges), generator=generator))


def test_gcn_as_gather_scatter_and_as_sparse_product_count_their_aggregation_differently() -> None:
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import coalesce, to_torch_csc_tensor
    x, edge_index = random_graph()
    torch.manual_seed(0)
    conv = GCNConv(FEATURES, HIDDEN, normalize=False)
    linear = 2 * NODES * FEATURES * HIDDEN  # x: [30, 8] @ w: [8, 16]
    # The same layer, its adjacency as a sparse matrix (duplicate edges merged into one stored entry).
    adjacency = to_torch_csc_tensor(edge_index, size=(NODES, NODES)).t()
    stored = coalesce(edge_index).size(1)
    assert stored < EDGES  # (random edges repeat: the sparse form stores fewer entries than edge_index has)
    counted = {}
    for form, graph in (("edges", edge_index), ("sparse", adjacency)):
        model = copy.deepcopy(conv)
        expected = copy.deepcopy(conv)(x, graph)
        with LayerProf(model, metrics=("flops",)) as prof:
            output = model(x, graph)
            output.sum().backward()
        assert torch.equal(output, expected)
        assert prof.records["lin"].flops_forward == linear and prof.records["lin"].flops_backward == linear
        counted[form] = prof.tree.flops_forward, prof.tree.flops_backward, prof.records["aggr_module"].calls
    # Gathers, elementwise messages and scatter-adds are not matmul-like: the aggregation counts 0 as edges.
    assert counted["edges"] == (linear, linear, 1)
    # As a sparse product it counts 2 * stored entries * features (and the same for x's gradient); the
    # aggregation module is not called.
    assert counted["sparse"] == (linear + 2 * stored * HIDDEN, linear + 2 * stored * HIDDEN, 0)


class GraphNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv
        self.gcn = GCNConv(FEATURES, HIDDEN)
        self.gat = GATConv(HIDDEN, HIDDEN // 4, heads=4)
        self.sage = SAGEConv(HIDDEN, HIDDEN)
        self.gin = GINConv(nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN)))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor | None = None) -> torch.Tensor:
        from torch_geometric.nn import global_mean_pool
        x = torch.relu(self.gcn(x, edge_index))
        x = torch.nn.functional.elu(self.gat(x, edge_index))
        x = torch.relu(self.sage(x, edge_index))
        x = self.head(self.gin(x, edge_index))
        return x if batch is None else global_mean_pool(x, batch)


@pytest.mark.parametrize("batched", [False, True], ids=["nodes", "graphs"])
def test_graph_network_training_steps(batched: bool) -> None:
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Batch, Data
    x, edge_index = random_graph()
    batch = None
    if batched:  # four graphs of 5, 10, 15 and 20 nodes in one Batch, one label each
        graphs = [Data(x=torch.randn(n, FEATURES), edge_index=torch.randint(0, n, (2, 3 * n))) for n in (5, 10, 15, 20)]
        joined = Batch.from_data_list(graphs)
        x, edge_index, batch = joined.x, joined.edge_index, joined.batch
    labels = torch.randint(0, CLASSES, (4 if batched else x.size(0),), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = GraphNet()
    reference = copy.deepcopy(model)

    def train(net: nn.Module, prof: LayerProf | None = None) -> list[torch.Tensor]:
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        outputs = []
        for _ in range(3):
            optimizer.zero_grad()
            output = net(x, edge_index, batch)
            torch.nn.functional.cross_entropy(output, labels).backward()
            outputs += [output.detach(), *(p.grad.clone() for p in net.parameters())]
            optimizer.step()
            if prof is not None:
                prof.step()
        return outputs

    expected = train(reference)
    with count_calls(model) as counts, LayerProf(model, metrics=("flops", "memory", "shapes")) as prof:
        outputs = train(model, prof)
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(outputs, expected))
    check_truth(prof, model)
    records, nodes = prof.records, x.size(0)
    # (the FLOP and memory meters' step is left out of the times: the calls are per step all the same)
    assert all(records[name].calls == 1 and count == 3 for name, count in counts.items())
    assert set(counts) == set(records)
    # The linear parts exactly; GAT's attention coefficients ((x * att).sum(-1)) and every aggregation count 0.
    assert records["gcn.lin"].flops_forward == 2 * nodes * FEATURES * HIDDEN
    assert records["gat"].flops_forward == records["gat.lin"].flops_forward == 2 * nodes * HIDDEN * HIDDEN
    assert records["sage"].flops_forward == 2 * (2 * nodes * HIDDEN * HIDDEN)  # lin_l and lin_r
    assert all(records[name].flops_forward == 0 for name in ("gcn.aggr_module", "gat.aggr_module"))
    # gcn.lin's input x needs no gradient: its backward is the weight's product only.
    assert records["gcn.lin"].flops_backward == 2 * nodes * FEATURES * HIDDEN
    assert records["gat.lin"].flops_backward == 2 * records["gat.lin"].flops_forward
    for name in ("gcn", "gat", "sage", "gin", "head"):
        assert records[name].backward_ms > 0 and records[name].saved_bytes > 0, name
    assert records["gcn"].input_dtypes == ["float32", "int64"]
    assert not any(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                   for module in model.modules())


# -- reinforcement learning: many small calls under no_grad, then one batched update with distributions ---------

class ActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.logits, self.mean, self.value = nn.Linear(16, 3), nn.Linear(16, 2), nn.Linear(16, 1)
        self.log_std = nn.Parameter(torch.zeros(2))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.body(obs)
        return self.logits(hidden), self.mean(hidden), self.value(hidden).squeeze(-1)


ROLLOUT = 200


def rl_step(model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> torch.Tensor:
    from torch.distributions import Categorical, Normal
    observations, actions, controls = [], [], []
    obs = torch.randn(1, 6, generator=generator)
    with torch.no_grad():
        for _ in range(ROLLOUT):
            logits, mean, _ = model(obs)
            actions.append(Categorical(logits=logits).sample())
            controls.append(Normal(mean, model.log_std.exp()).sample())
            observations.append(obs)
            obs = torch.tanh(obs + 0.1 * torch.randn(1, 6, generator=generator))
    logits, mean, value = model(torch.cat(observations))
    policy, gaussian = Categorical(logits=logits), Normal(mean, model.log_std.exp())
    loss = (-(policy.log_prob(torch.cat(actions)) * value.detach()).mean()
            - gaussian.log_prob(torch.cat(controls)).mean() + value.pow(2).mean() - policy.entropy().mean()
            + gaussian.rsample().pow(2).mean())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()


def test_reinforcement_learning_rollouts_and_update() -> None:
    torch.manual_seed(0)
    model = ActorCritic()
    reference = copy.deepcopy(model)

    def train(net: nn.Module, prof: LayerProf | None = None) -> list[torch.Tensor]:
        torch.manual_seed(1)
        generator = torch.Generator().manual_seed(2)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
        losses = []
        for _ in range(3):
            losses.append(rl_step(net, optimizer, generator))
            if prof is not None:
                prof.step()
        return losses

    expected = train(reference)
    with count_calls(model) as counts, LayerProf(model) as prof:
        losses = train(model, prof)
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(losses, expected))
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(model.parameters(), reference.parameters()))
    root = prof.tree
    assert root.steps == 3 and root.calls == ROLLOUT + 1  # the rollout's calls and the update's, per step
    check_truth(prof, model, reference=counts)
    # Only the update's call has a backward: a module's backward is within one call's, far below its forward.
    assert 0 < root.backward_ms < root.forward_ms
    assert root.forward_ms_min <= root.forward_ms_median <= root.forward_ms_max
    assert len(prof.records["body.0"].call_times) == ROLLOUT + 1  # every call of the last step
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
