"""The checkpoint planner inside what a training script does around a plan: autocast around the step, a PEFT
wrapper between the profiled model and the one trained, a batch other than the profiled one. Each test is a
problem a sweep of such scripts found."""
from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import layerprof

from .conftest import profile_quietly


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64)),
                         nn.Tanh(), nn.Linear(64, 1))


def _autocast_step(model: nn.Module, x: torch.Tensor) -> Any:
    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().sum()
        loss.backward()
    return step


def _caught(run: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if str(w.message).startswith("checkpoint plan")]


def test_a_plan_warns_when_its_step_runs_under_another_autocast_than_the_profiled_one() -> None:
    # A plan made on a step under bfloat16 autocast and applied in a float32 one (or the other way round): autocast's
    # matrix products save bf16 copies of their inputs and weights, so what the step saves is not what the plan
    # predicted. The mode and the parameters' dtype were checked at the first wrapped call; autocast was not, and
    # the plan missed its budget silently (18,432 bytes saved against 9,344 predicted, budget 14,912).
    model, x = _net(), torch.randn(32, 16)
    plain, amp = (lambda: model(x).sum().backward()), _autocast_step(model, x)
    prof = profile_quietly(model, amp, 2)
    plan = layerprof.loads(prof.profile.to_json()).checkpoint_plan("50%", wrap_cost=None, runs=False)
    assert plan.profiled_as == {"training": True, "dtype": "float32", "autocast": "bfloat16", "batch_size": 32}
    assert plan.saved_bytes_before == 29824  # (float32: 26,624 below; autocast keeps bf16 copies besides)
    with plan.applied(model):
        assert _caught(amp) == []
    with plan.applied(model):
        found = _caught(plain)
    assert len(found) == 1 and "runs without torch.autocast, and the profiled step ran under" in found[0]
    assert "torch.autocast (bfloat16)" in found[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        missed, met = plan.verify(model, plain, repeats=1), plan.verify(model, amp, repeats=1)
    assert met.measured_saved_bytes == met.predicted_saved_bytes == plan.saved_bytes_after and met.meets_budget
    if plan.modules == ["1"]:  # (the cheapest plan on an idle machine; the times decide)
        assert (missed.measured_saved_bytes, plan.saved_bytes_after, missed.meets_budget) == (18432, 9344, False)

    # Profiled in float32, a step under autocast is told the same; one in float32 runs without a word.
    prof = profile_quietly(model, plain, 2)
    plan = layerprof.loads(prof.profile.to_json()).checkpoint_plan("75%", wrap_cost=None, runs=False)
    assert plan.profiled_as == {"training": True, "dtype": "float32", "autocast": False, "batch_size": 32}
    assert plan.saved_bytes_before == 26624
    with plan.applied(model):
        assert _caught(plain) == []
    with plan.applied(model):
        found = _caught(amp)
    assert len(found) == 1 and "runs under torch.autocast (bfloat16), and the profiled step ran without" in found[0]
    # An autocast entered with gradients off (an evaluation pass in the step before it trains) is not the step's.
    def evaluated_then_trained() -> None:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)
        plain()

    assert profile_quietly(model, evaluated_then_trained, 1).profile.meta["memory"]["autocast"] is False


def test_under_autocast_the_plan_changes_no_bit_of_the_loss_or_the_gradients() -> None:
    model, x = _net(), torch.randn(32, 16)
    amp = _autocast_step(model, x)
    plan = profile_quietly(model, amp, 2).checkpoint_plan("25%", wrap_cost=None)
    assert plan.modules

    def grads() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        amp()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    with plan.applied(model):
        wrapped = grads()
    assert all(torch.equal(a, b) for a, b in zip(plain, wrapped))


def _llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64,
                                      use_cache=False)
    return transformers.LlamaForCausalLM(config).train()


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_plan_applied_across_a_peft_wrapper_says_which_side_to_apply_it_to() -> None:
    # PEFT's get_peft_model holds the model at base_model.model: a plan made on the PeftModel names its modules
    # "base_model.model.model.layers.0...", one made on the model inside "model.layers.0...". Applied across, the
    # refusal said only "apply the plan to the model it was made for", as it said before the hint for DDP's and
    # torch.compile's wrappers (module, _orig_mod) was added; now it says which side to apply it to.
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_llama(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                          lora_dropout=0.0))
    inner = model.base_model.model
    ids = torch.randint(0, 100, (2, 16))
    for profiled in (model, inner):
        plan = profile_quietly(profiled, lambda: model(input_ids=ids, labels=ids).loss.backward(), 2
                               ).checkpoint_plan("50%", wrap_cost=None)
        assert plan.modules and all(name.startswith("base_model.model.") == (profiled is model)
                                    for name in plan.modules)
        other = inner if profiled is model else model
        with pytest.raises(ValueError) as refused:
            plan.apply(other)
        assert not plan.is_applied and not any("forward" in vars(m) for m in model.modules())
        if profiled is model:
            assert ("the plan was made for a model that wraps this one (its names start with 'base_model.model', as "
                    "those of a PEFT model (get_peft_model) do): apply it to that wrapper") in str(refused.value)
        else:
            assert "the plan was made for the model this PeftModel wraps: apply it to model.base_model.model" in str(
                refused.value)
        with plan.applied(profiled):  # (the side it names takes it)
            model(input_ids=ids, labels=ids).loss.backward()
        assert not any("forward" in vars(m) for m in model.modules())


def test_verifying_a_plan_on_a_step_of_another_batch_says_the_plan_is_of_the_profiled_batch() -> None:
    # A plan made on a step of batch 8 and verified on one of 32 measured 4 times its predicted bytes (GPT-2 at
    # batch 2 and 8: 2,672,900 bytes against 668,420, budget 695,170), and the verification read as a plan that
    # predicts badly ("+299.9%, budget NOT met"): it now says that the plan's figures are those of the profiled
    # batch, and how many times more the step saved.
    model = _net()
    small, large = torch.randn(8, 16), torch.randn(32, 16)
    plan = profile_quietly(model, lambda: model(small).sum().backward(), 2).checkpoint_plan("75%", wrap_cost=None,
                                                                                             runs=False)
    assert plan.modules
    assert plan.profiled_as["batch_size"] == 8
    same = plan.verify(model, lambda: model(small).sum().backward(), repeats=1)
    assert same.batch_sizes == (8, 8) and "batch" not in str(same)
    other = plan.verify(model, lambda: model(large).sum().backward(), repeats=1)
    assert other.batch_sizes == (8, 32)
    assert (other.measured_saved_bytes, other.predicted_saved_bytes) == (4 * plan.saved_bytes_after,
                                                                         plan.saved_bytes_after)
    assert ("note: the verified step's batch is 32, the profiled step's 8: the plan's predicted bytes, time and "
            "budget are those of a batch of 8 (what a step saves grows with its batch: 4.00 times the predicted "
            "bytes here)") in str(other)
    assert not any("forward" in vars(m) for m in model.modules())
