"""Counting without memory: a model on the meta device or on fake tensors (``FakeTensorMode``).

Its ops compute nothing, so FLOPs, bytes, parameters and saved bytes are exact functions of shapes while times are
the host's bookkeeping: the profile keeps no time (``meta["untimed"]``), says so where a time would be shown, and
refuses what needs one (FLOP/s plots, the roofline plot, checkpoint plans). FLOPs are checked against hand
arithmetic and torch's ``FlopCounterMode``, up to a real-size Llama-2-7B step that allocates nothing.
"""
from __future__ import annotations

import json
import resource
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

import layerprof
from layerprof import LayerProf
from layerprof.cli import main


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(width), RMSNorm(width)
        self.self_attn = Attention(width, heads)
        self.gate_proj, self.up_proj = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """Llama's layout in plain torch (RMSNorm, SDPA attention, a SwiGLU MLP, an untied head)."""

    def __init__(self, vocab: int = 1000, width: int = 64, heads: int = 4, hidden: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def forward_flops(batch: int, seq: int, vocab: int, width: int, heads: int, hidden: int, layers: int) -> int:
    """Llama's forward FLOPs by hand, 2 * m * n * k per matmul: per layer four [t, d] @ [d, d] projections, three
    MLP products ([t, d] @ [d, f] twice, [t, f] @ [f, d]) and attention's two [s, dh] x [dh, s] products per head
    (SDPA counts the causal mask's zeros, as FlopCounterMode does); then the head [t, d] @ [d, vocab]."""
    tokens, head_dim = batch * seq, width // heads
    per_layer = 4 * 2 * tokens * width * width + 3 * 2 * tokens * width * hidden
    per_layer += 2 * 2 * batch * heads * seq * seq * head_dim
    return layers * per_layer + 2 * tokens * width * vocab


SMALL = {"vocab": 1000, "width": 64, "heads": 4, "hidden": 128, "layers": 2}


def train_step(model: nn.Module, ids: torch.Tensor) -> None:
    logits = model(ids)
    F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()


def meta_profile(metrics: tuple[str, ...] = ("flops", "params", "memory"), **kwargs) -> LayerProf:
    with torch.device("meta"):
        model = Llama(**SMALL)
    ids = torch.randint(0, 1000, (2, 32), device="meta")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "one step slowed by the meters": there are no times
        with LayerProf(model, metrics=metrics, **kwargs) as prof:
            train_step(model, ids)
    return prof


def test_meta_flops_are_the_hand_count_and_flop_counter_modes() -> None:
    # 2 x 32 tokens: layers 2 * (2,097,152 + 3,145,728 + 524,288) + head 8,192,000 = 19,726,336 forward; every
    # activation needs a gradient (the embedding's weight trains), so backward is twice that: two products per one.
    prof = meta_profile()
    forward = forward_flops(2, 32, **SMALL)
    assert forward == 19_726_336
    assert prof.tree.flops_forward == forward and prof.tree.flops_backward == 2 * forward
    with torch.device("meta"):
        model = Llama(**SMALL)
    with FlopCounterMode(display=False) as counter:
        train_step(model, torch.randint(0, 1000, (2, 32), device="meta"))
    assert counter.get_total_flops() == 3 * forward
    # One projection: [64, 64] @ [64, 64] forward, twice that backward.
    q_proj = prof.records["layers.0.self_attn.q_proj"]
    assert (q_proj.flops_forward, q_proj.flops_backward) == (2 * 64 * 64 * 64, 2 * 2 * 64 * 64 * 64)


def test_a_meta_profile_keeps_no_time_and_says_so() -> None:
    prof = meta_profile()
    assert prof.meta["untimed"] == "meta" and "step_ms" not in prof.meta and "timing_distorted_by" not in prof.meta
    for record in prof.records.values():
        assert (record.forward_ms, record.backward_ms, record.self_forward_ms, record.forward_ms_median) == (
            None, None, None, None)
        assert record.call_times == []
    assert prof.records["lm_head"].calls == 1 and prof.records["lm_head"].params == 64 * 1000
    # Saved bytes are sizes: the head saves its float32 input, 64 tokens x 64 wide.
    assert prof.records["lm_head"].self_saved_bytes == 64 * 64 * 4
    summary = prof.layerwise_summary(depth=0)
    assert summary.splitlines()[0].startswith("No times: the step ran on the meta device, where ops compute nothing")
    assert "FLOPs: 59.2 MFLOPs (100.0%) | Params: 210k (100.0%) | Saved: 690 KiB (100.0%)" in summary
    assert "Forward Time" not in summary and " ms" not in summary
    # Asked for, a time column would show "—" on every module (FLOP/s too): refused, as the command line does.
    for asked in (("forward_ms",), ("flops", "flops_per_s"), ("forward_percent",)):
        with pytest.raises(ValueError, match=f"column '{asked[-1]}' reads a measured time, and this profile has no "
                                             "times: the step ran on the meta device"):
            prof.layerwise_summary(columns=asked, depth=0)
    row = prof.to_csv().splitlines()[1].split(",")
    assert row[5:7] == ["", ""]  # forward_ms, backward_ms


def test_what_needs_times_says_why_it_has_none() -> None:
    prof = meta_profile()
    with pytest.raises(ValueError, match=r"cannot rank by 'total_ms': no times: the step ran on the meta device"):
        prof.top(3)
    assert [row["name"] for row in prof.top(1, by="flops")] == ["lm_head"]
    with pytest.raises(ValueError, match="this profile has no times: its step ran on the meta device or fake"):
        prof.plot("sunburst")
    prof.plot("icicle", metric="flops")
    with pytest.raises(ValueError, match="checkpoint_plan: no times: .* prices each module's recomputation"):
        prof.checkpoint_plan(budget="50%")
    with pytest.raises(ValueError, match="no roofs for this profile: no times: .* peaks="):
        prof.roofline()
    with pytest.raises(ValueError, match="the roofline plots the FLOP/s each module achieved, which needs times"):
        prof.plot("roofline")
    report = prof.to_report()
    assert '"untimed": "no times: the step ran on the meta device' in report
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the roofs of meta are not measured (it raised inside)
        text = prof.to_json()
    loaded = layerprof.loads(text)
    assert "peaks" not in loaded.meta and loaded.layerwise_summary(depth=0) == prof.layerwise_summary(depth=0)
    trace = json.loads(prof.to_trace())
    assert [event for event in trace["traceEvents"] if event["ph"] == "X"] == []


def test_roofline_of_a_meta_profile_at_given_roofs_is_its_attainable_time() -> None:
    # At 1e12 FLOP/s and 1e11 B/s the head's own ops (24,576,000 FLOPs, its bytes) take max(FLOPs / 1e12,
    # bytes / 1e11) s; nothing measured is shown.
    prof = meta_profile(peaks={"flops": 1e12, "bandwidth": 1e11})
    table = prof.roofline()
    assert "self_total_ms" not in table.columns and "efficiency" not in table.columns
    head = next(row for row in table if row["name"] == "lm_head")
    record = prof.records["lm_head"]
    expected = 1000.0 * max(record.self_flops / 1e12, record.self_bytes / 1e11)
    assert head["attainable_ms"] == pytest.approx(expected) and head["bound"] in ("compute", "memory")


def test_fake_tensor_mode_counts_the_same_forward_and_keeps_no_time() -> None:
    with FakeTensorMode():
        model = Llama(**SMALL)
        ids = torch.randint(0, 1000, (2, 32))
        with LayerProf(model, metrics=("flops",)) as prof:
            train_step(model, ids)
    assert prof.meta["untimed"] == "fake" and prof.tree.forward_ms is None
    assert prof.tree.flops_forward == forward_flops(2, 32, **SMALL)
    # The fake CPU runs the CPU's fused attention, whose backward recomputes the scores: one [s, dh] x [dh, s]
    # product per head and layer more than the meta device's math path.
    recompute = SMALL["layers"] * 2 * 2 * 4 * 32 * 32 * 16
    assert prof.tree.flops_backward == 2 * prof.tree.flops_forward + recompute
    assert prof.layerwise_summary(depth=0).startswith("No times: the step ran on fake tensors (FakeTensorMode)")


def test_a_hugging_face_llama_counts_on_fake_tensors_and_meta_says_to_use_them() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
                                      use_cache=False, attn_implementation="sdpa")
    with FakeTensorMode():
        model = transformers.LlamaForCausalLM(config)
        ids = torch.randint(0, 1000, (2, 32))
        with LayerProf(model, metrics=("flops",)) as prof:
            model(input_ids=ids, labels=ids).loss.backward()
    assert prof.tree.flops_forward == forward_flops(2, 32, **SMALL)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 1000, (2, 32), device="meta")
    try:  # transformers reads values of the mask (``.all()``) that meta tensors do not have; a later one may not
        with LayerProf(model, metrics=("flops",)):
            model(input_ids=ids, labels=ids)
    except RuntimeError as error:
        assert "meta tensor" in str(error)
        assert any("torch._subclasses.fake_tensor.FakeTensorMode()" in note for note in error.__notes__)


def test_llama_2_7b_on_meta_counts_its_analytic_flops_in_seconds_without_allocating() -> None:
    # hidden 4096, 32 layers, 32 heads, MLP 11008, vocab 32000, one sequence of 2048: 29,261,612,187,648 FLOPs
    # forward (the model is 6.74B parameters, 27 GB in float32, never allocated), twice that backward.
    shape = {"vocab": 32000, "width": 4096, "heads": 32, "hidden": 11008, "layers": 32}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.device("meta"):
        model = Llama(**shape)
    ids = torch.randint(0, 32000, (1, 2048), device="meta")
    with LayerProf(model, metrics=("flops", "params")) as prof:
        train_step(model, ids)
    forward = forward_flops(1, 2048, **shape)
    assert forward == 29_261_612_187_648
    assert prof.tree.flops_forward == forward and prof.tree.flops_backward == 2 * forward
    assert prof.tree.params == 6_738_415_616
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # (KiB on Linux)
    assert grown_kib < 512 * 1024, f"the peak resident memory grew {grown_kib} KiB"


def write_model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_llama.py"
    path.write_text("from tests.test_meta import Llama\n")
    return path


def test_the_command_counts_on_meta_and_refuses_what_needs_times(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"{write_model(tmp_path)}:Llama"
    saved = tmp_path / "p.json"
    argv = [spec, "-i", "2,32:int64", "--vocab", "1000", "--device", "meta", "--metrics", "flops,params"]
    assert main([*argv, "--json", str(saved)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("| meta, float32 | input 2x32 int64 | 1 step counted, not timed, forward + backward")
    assert out[1].startswith("No times: the step ran on the meta device")
    doc = json.loads(saved.read_text())
    assert doc["meta"]["untimed"] == "meta" and doc["meta"]["steps"] == 1
    assert doc["records"][0]["flops_forward"] == forward_flops(2, 32, **SMALL)
    for extra, said in ((["--columns", "forward"], "so forward would show nothing"),
                        (["--checkpoint-budget", "50%"], "a checkpoint plan prices recomputation by time"),
                        (["--plot", str(tmp_path / "p.png")], "--plot-metric total: --device meta counts")):
        assert main([*argv, *extra]) == 2
        assert said in capsys.readouterr().err
    # The saved profile asked for a plan: refused with why, and not told to profile with the memory meter
    assert main(["show", str(saved), "--checkpoint-budget", "50%"]) == 2
    err = capsys.readouterr().err
    assert "prices each module's recomputation" in err and "from the shell" not in err


def test_a_comparison_with_a_meta_profile_does_not_read_its_missing_times_as_forward_only() -> None:
    # Both steps ran forward and backward; the meta one has no backward_ms, which is no sign of a forward-only step.
    meta = meta_profile(metrics=("params",)).profile
    model = Llama(**SMALL)
    with LayerProf(model, metrics=("params",)) as prof:
        train_step(model, torch.randint(0, 1000, (2, 32)))
    text = str(layerprof.compare(meta, prof.profile))
    assert "a ran on meta and b on cpu" in text and "forward only" not in text
    # With the flops meter its backward is counted: the same passes as the timed step, nothing said of them.
    counted = meta_profile(metrics=("flops",)).profile
    assert "forward only" not in str(layerprof.compare(counted, prof.profile))


def test_a_model_without_parameters_on_meta_or_fake_inputs_keeps_no_time() -> None:
    # No parameter to say where the model runs: its input does (meta), or is a fake tensor whose mode has been left
    # before the block ends.
    model = nn.Sequential(nn.Softmax(-1), nn.ReLU())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "one step slowed by the meters": there are no times
        with LayerProf(model, metrics=("flops",)) as prof:
            model(torch.randn(4, 8, device="meta", requires_grad=True)).sum().backward()
    assert prof.meta["untimed"] == "meta" and prof.tree.forward_ms is None and "step_ms" not in prof.meta
    prof = LayerProf(model, metrics=("flops",))
    prof.start()
    with FakeTensorMode():
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    prof.stop()
    assert prof.meta["untimed"] == "fake" and prof.records["0"].forward_ms is None
