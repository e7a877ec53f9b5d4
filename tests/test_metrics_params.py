"""The params meter: exact counts and bytes, frozen parameters, buffers, shared and tied parameters counted once."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.metrics import DEFAULT_METRICS
from layerprof.metrics.params import PARAM_FIELDS, module_params
from layerprof.render.footer import summary_footer, tied_groups

from .models import MLP

transformers = pytest.importorskip("transformers")

INCLUSIVE = ("params", "trainable_params", "param_bytes", "buffers", "buffer_bytes")


def _profile(model: nn.Module, *args: torch.Tensor, metrics: tuple[str, ...] = ("params",), **kwargs: torch.Tensor) -> LayerProf:
    with LayerProf(model, metrics=metrics) as prof:
        model(*args, **kwargs)
    return prof


def _check_inclusive(prof: LayerProf) -> None:
    for record in prof.records.values():
        for child in record.children:
            for field in INCLUSIVE:
                assert getattr(child, field) <= getattr(record, field), (record.name, child.name, field)
        assert record.own_params <= record.params


def test_linear_counts_and_bytes() -> None:
    values = module_params(nn.Linear(10, 20))
    # 10*20 weights + 20 biases = 220 elements; float32: 220 * 4 = 880 bytes.
    assert values["params"] == values["own_params"] == values["trainable_params"] == 220
    assert values["param_bytes"] == values["own_param_bytes"] == 880
    assert values["param_dtypes"] == {"float32": 220}
    assert values["buffers"] == values["buffer_bytes"] == values["shared_params"] == 0
    assert values["shared_with"] == {}


def test_inclusive_own_and_frozen() -> None:
    model = MLP()  # body: Linear(8, 16), ReLU, Linear(16, 16), ReLU; head: Linear(16, 1)
    model.body[0].requires_grad_(False)
    prof = _profile(model, torch.randn(2, 8))
    records = prof.records
    # Linear(8, 16): 8*16 + 16 = 144; Linear(16, 16): 16*16 + 16 = 272; Linear(16, 1): 16 + 1 = 17.
    assert records["body.0"].params == 144 and records["body.2"].params == 272 and records["head"].params == 17
    assert records["body"].params == 144 + 272 and records["body"].own_params == 0
    assert records[""].params == 144 + 272 + 17 == 433
    assert records[""].trainable_params == 272 + 17  # body.0 is frozen
    assert records[""].param_bytes == 433 * 4
    assert records["body.1"].params == 0 and records["body.1"].param_dtypes == {}
    text = prof.layerwise_summary(columns=("params", "trainable_params", "frozen_params", "param_bytes"))
    assert "MLP【Params: 433 (100.0%) | Trainable: 289 | Frozen: 144 | Param Size: 1.69 KiB (100.0%)】" in text
    _check_inclusive(prof)


class _ToFloat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


def test_batchnorm_buffers_and_dtypes() -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3, bias=False).double(), _ToFloat(), nn.BatchNorm2d(16))
    prof = _profile(model.eval(), torch.randn(1, 3, 8, 8, dtype=torch.float64))
    bn = prof.records["2"]
    # Parameters: weight 16 + bias 16 = 32 float32 = 128 bytes.
    assert bn.params == 32 and bn.param_bytes == 32 * 4 and bn.param_dtypes == {"float32": 32}
    # Buffers: running_mean 16 + running_var 16 (float32) + num_batches_tracked 1 (int64: 8 bytes).
    assert bn.buffers == 16 + 16 + 1
    assert bn.buffer_bytes == 16 * 4 + 16 * 4 + 8 == 136
    root = prof.records[""]
    # Conv2d(3, 16, 3, bias=False): 16*3*3*3 = 432 float64 elements = 3456 bytes.
    assert root.params == 432 + 32 and root.param_dtypes == {"float64": 432, "float32": 32}
    assert root.param_bytes == 432 * 8 + 32 * 4 == 3584 and root.buffer_bytes == 136
    assert module_params(nn.BatchNorm1d(4).half())["buffer_bytes"] == 4 * 2 + 4 * 2 + 8  # float16 stats
    footer = summary_footer(prof.tree)
    # Model size = 3584 + 136 = 3720 bytes = 3.63 KiB.
    assert footer.startswith("Model size: 3.63 KiB = 3.5 KiB of parameters (464, 0 frozen) + 136 B of buffers.")


def test_shared_module_is_counted_once() -> None:
    layer = nn.Linear(10, 10)
    model = nn.Sequential(layer, nn.ReLU(), layer)  # one module, two names
    prof = _profile(model, torch.randn(4, 10))
    assert list(prof.records) == ["", "0", "1"] and prof.records["0"].aliases == ["2"]
    assert prof.records[""].params == 10 * 10 + 10 == 110  # not 220
    assert prof.records["0"].shared_params == 0  # module sharing is an alias, not parameter tying
    _check_inclusive(prof)


def test_tied_parameter_is_counted_once_and_named() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model[1].weight = model[0].weight
    prof = _profile(model, torch.randn(2, 8))
    records = prof.records
    # Two Linear(8, 8) would be 2 * (64 + 8) = 144; the tied 8*8 weight counts once: 144 - 64 = 80.
    assert records[""].params == 80 and records[""].param_bytes == 80 * 4
    assert records["0"].params == records["1"].params == 72  # each module still holds its whole weight
    assert records["0"].shared_params == records["1"].shared_params == 64
    assert records["1"].shared_with == {"weight": ["0.weight"]} and records["0"].shared_with == {"weight": ["1.weight"]}
    assert tied_groups(prof.tree) == [["0.weight", "1.weight"]]


class _TwoNames(nn.Module):
    """One 4x4 parameter under two names of one module."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(4, 4))
        self.b = self.a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.a @ self.b


def test_a_parameter_under_two_names_of_one_module_is_shared_with_no_other_module() -> None:
    # shared_params counts elements another module holds too, each tensor once: 0 here (before: 32, one 16 per
    # name, more than the module's own 16), and 16 where another module holds it as well (not 32).
    prof = _profile(_TwoNames(), torch.randn(3, 4))
    root = prof.records[""]
    assert root.params == root.own_params == 16 and root.shared_params == 0
    assert root.shared_with == {"a": ["b"], "b": ["a"]}  # (the other names still listed)
    model = nn.Sequential(_TwoNames(), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].a
    prof = _profile(model, torch.randn(3, 4))
    assert prof.records["0"].shared_params == prof.records["1"].shared_params == 16
    assert prof.records[""].params == 16


def test_gpt2_tied_embeddings() -> None:
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 100, (2, 8))
    prof = _profile(model, input_ids=ids)
    records = prof.records
    # wte 100*32 = 3200; wpe 32*32 = 1024; per block: ln_1 2*32 = 64, c_attn 32*96 + 96 = 3168,
    # attn c_proj 32*32 + 32 = 1056, ln_2 64, c_fc 32*128 + 128 = 4224, mlp c_proj 128*32 + 32 = 4128 -> 12704;
    # ln_f 64; lm_head's weight is wte's: 0 more. 3200 + 1024 + 2*12704 + 64 = 29696.
    assert records[""].params == 29696 == sum(p.numel() for p in model.parameters())
    assert records["lm_head"].params == records["lm_head"].own_params == 3200
    assert records[""].params < sum(r.own_params for r in records.values()) == 29696 + 3200
    assert records["lm_head"].shared_with == {"weight": ["transformer.wte.weight"]}
    assert records["transformer.wte"].shared_with == {"weight": ["lm_head.weight"]}
    assert records["transformer"].params == 29696 - 0  # the tied weight belongs to transformer.wte
    assert "shared, counted once: lm_head.weight = transformer.wte.weight" in summary_footer(prof.tree)
    _check_inclusive(prof)


def test_t5_shared_embeddings() -> None:
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                                   decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config)
    ids = torch.randint(0, 100, (2, 8))
    prof = _profile(model, input_ids=ids, labels=ids)
    records = prof.records
    holders = ["decoder.embed_tokens.weight", "encoder.embed_tokens.weight", "lm_head.weight", "shared.weight"]
    assert tied_groups(prof.tree) == [holders]
    assert sorted(records["shared"].shared_with["weight"]) == holders[:3]
    assert records[""].params == sum(p.numel() for p in model.parameters())
    # The 100*32 = 3200-element embedding is held by four modules and counted once in the root.
    assert sum(r.own_params for r in records.values()) - records[""].params == 3 * 3200
    assert records["encoder"].params >= 3200  # the encoder holds the embedding through embed_tokens
    _check_inclusive(prof)


def test_lazy_module_counted_after_it_ran() -> None:
    model = nn.Sequential(nn.LazyLinear(5))
    prof = _profile(model, torch.randn(2, 3))
    assert prof.records[""].params == 3 * 5 + 5


def test_params_are_a_default_and_can_be_turned_off() -> None:
    assert "params" in DEFAULT_METRICS
    model = MLP()
    with LayerProf(model) as prof:
        model(torch.randn(2, 8))
    row = prof.to_dict()[""]
    assert all(field in row for field in PARAM_FIELDS) and row["params"] == 433
    assert "input_shapes" not in row and "saved_bytes" not in row  # not defaults: they cost per call
    with LayerProf(model, metrics=()) as prof:
        model(torch.randn(2, 8))
    assert "params" not in prof.to_dict()[""]



class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 4)  # 8*4 + 4 = 36
        self.b = nn.Linear(4, 4)  # 4*4 + 4 = 20

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).to(self.b.weight.dtype))


def _params_of(model: nn.Module) -> dict[str, dict]:
    with LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
    return {name: {field: getattr(record, field) for field in PARAM_FIELDS} for name, record in prof.records.items()}


def test_figures_follow_every_change_between_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # A model profiled again is measured once while nothing it holds changes; after each change below the next
    # profile shows exactly what a first profile of the changed model (a deep copy) shows.
    import copy

    import layerprof.metrics.params as params_module

    measured = []
    real = params_module.measure_params
    monkeypatch.setattr(params_module, "measure_params", lambda entries: measured.append(1) or real(entries))
    model = TwoLinears()
    first = _params_of(model)
    assert _params_of(model) == first and len(measured) == 1  # the second profile reused the figures
    assert first[""]["params"] == 56 and first[""]["param_bytes"] == 56 * 4
    changes = [  # (change, root params, trainable, param_bytes, buffers)
        ("freeze a", lambda m: m.a.requires_grad_(False), 56, 20, 224, 0),
        ("b to float64, same tensors", lambda m: m.b.double(), 56, 20, 36 * 4 + 20 * 8, 0),
        ("new weight on b", lambda m: setattr(m.b, "weight", nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))),
         56, 20, 304, 0),
        ("a replaced without bias", lambda m: setattr(m, "a", nn.Linear(8, 4, bias=False)), 52, 52, 32 * 4 + 160, 0),
        ("a's weight tied onto b", lambda m: setattr(m.b, "extra", m.a.weight), 52, 52, 288, 0),
        ("buffer on a", lambda m: m.a.register_buffer("scale", torch.ones(3)), 52, 52, 288, 3),
        ("b shared under a second name", lambda m: m.add_module("again", m.b), 52, 52, 288, 3),
    ]
    for change, apply, params, trainable, param_bytes, buffers in changes:
        apply(model)
        now = _params_of(model)
        assert now == _params_of(copy.deepcopy(model)), change
        root = now[""]
        assert (root["params"], root["trainable_params"], root["param_bytes"], root["buffers"]) == (
            params, trainable, param_bytes, buffers), change
    assert now["a"]["shared_with"] == {"weight": ["b.extra"]}
    assert len(measured) == 1 + 2 * len(changes)  # each changed model measured afresh, and each copy


def test_records_of_two_profiles_do_not_share_containers() -> None:
    model = TwoLinears()
    model.b.extra = model.a.weight
    first, second = _params_of(model), _params_of(model)
    first[""]["param_dtypes"]["float32"] = -1
    first["a"]["shared_with"]["weight"].append("elsewhere")
    assert second[""]["param_dtypes"] == {"float32": 56}
    assert second["a"]["shared_with"] == {"weight": ["b.extra"]}
