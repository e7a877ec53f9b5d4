"""The Hugging Face Trainer as users meet it: a dataset or a forward that raises mid-run, an interrupt, train twice,
evaluate alone, max_steps with accumulation. A real Trainer on a one-layer BERT from a config, on CPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import layerprof
from layerprof import LayerProf
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from layerprof.integrations.transformers import LayerProfCallback  # noqa: E402

OVER = "Trainer.train() ended before on_train_end: it raised or was interrupted"


class Tokens(torch.utils.data.Dataset):
    """16 sequences of 8 tokens; the ``fail_after``-th item fetched and later ones raise ``error``, or, with
    ``bad_ids``, come with token ids past the vocabulary (an IndexError inside the model's embedding)."""

    def __init__(self, fail_after: int | None = None, error: type[BaseException] = IndexError,
                 bad_ids: bool = False) -> None:
        self.fetched = 0
        self.fail_after, self.error, self.bad_ids = fail_after, error, bad_ids

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict:
        self.fetched += 1
        failing = self.fail_after is not None and self.fetched > self.fail_after
        if failing and not self.bad_ids:
            raise self.error(f"item {index} is missing")
        ids = torch.randint(0, 100, (8,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids + 1000 if failing else ids, "labels": torch.tensor(index % 2)}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    return transformers.BertForSequenceClassification(config)


def _trainer(model, folder: Path, data: Tokens, callback: LayerProfCallback | None, **options):
    settings = {"per_device_train_batch_size": 2, "max_steps": 4, "report_to": [], **options}
    args = transformers.TrainingArguments(output_dir=str(folder), use_cpu=True, save_strategy="no",
                                          disable_tqdm=True, logging_steps=100, **settings)
    return transformers.Trainer(model=model, args=args, train_dataset=data,
                                callbacks=[callback] if callback is not None else [])


def _hooks(model) -> dict:
    return {name: state[:-1] for name, state in hook_state(model).items()}


def _batch() -> dict:
    return {"input_ids": torch.zeros(1, 8, dtype=torch.long)}


@pytest.mark.parametrize("error", [IndexError, KeyboardInterrupt])
def test_a_dataset_that_raises_ends_the_profile_at_the_next_model_call(tmp_path: Path, error) -> None:
    model = _model()
    before = _hooks(model)
    callback = LayerProfCallback()
    # Batches of 2: items 1-2, 3-4, 5-6, then 7-8, which raise. The accelerate loader reads one batch ahead, so
    # batch 4 is read as batch 3 is handed over, before step 3 begins: steps 1 and 2 complete.
    with pytest.raises(error, match="is missing"):
        _trainer(model, tmp_path, Tokens(fail_after=6, error=error), callback).train()
    assert LayerProf.running_on(model) is not None  # the Trainer told no callback
    model(**_batch())  # the first call after the run: the callback sees that the run is over
    assert _hooks(model) == before and not _PROFILED
    saved = layerprof.load(tmp_path / "layerprof.json")
    assert saved.meta["steps"] == 2 and saved.meta["partial"] == OVER
    assert (tmp_path / "layerprof.txt").read_text().startswith(f"Partial profile (2 steps recorded): {OVER}.\n")
    assert callback.profile.meta["partial"] == OVER


def test_a_forward_that_raises_gives_way_to_a_new_profiler(tmp_path: Path) -> None:
    model = _model()
    before = _hooks(model)
    callback = LayerProfCallback()
    # Items 7-8 (step 4's batch) have token ids past the vocabulary: the embedding raises inside step 4, with the
    # hooks on, after steps 1-3 completed.
    with pytest.raises(IndexError):
        _trainer(model, tmp_path, Tokens(fail_after=6, bad_ids=True), callback).train()
    with LayerProf(model) as prof:  # the callback's profiler, whose run is over, gives way
        model(**_batch())
    assert prof.tree.calls == 1
    assert _hooks(model) == before and not _PROFILED
    assert callback.profile.meta["steps"] == 3 and callback.profile.meta["partial"] == OVER


def test_a_new_train_after_a_failed_one(tmp_path: Path) -> None:
    model = _model()
    before = _hooks(model)
    callback = LayerProfCallback()
    with pytest.raises(IndexError):
        _trainer(model, tmp_path, Tokens(fail_after=6), callback).train()
    retry = LayerProfCallback(output_dir=tmp_path / "retry")
    _trainer(model, tmp_path, Tokens(), retry).train()  # a fresh callback, the same model
    assert retry.profile.meta["steps"] == 4 and "partial" not in retry.profile.meta
    assert callback.profile.meta["partial"] == OVER
    # The same callback on a run again: the failed run's profile is kept, the new one is whole.
    _trainer(model, tmp_path, Tokens(), callback).train()
    assert [p.meta.get("partial") for p in callback.profiles] == [OVER, None]
    assert [p.meta["steps"] for p in callback.profiles] == [2, 4]
    assert json.loads((tmp_path / "layerprof-2.json").read_text())["meta"]["steps"] == 4
    assert _hooks(model) == before and not _PROFILED


def test_train_twice_with_one_callback_profiles_both(tmp_path: Path) -> None:
    model = _model()
    callback = LayerProfCallback()
    trainer = _trainer(model, tmp_path, Tokens(), callback, max_steps=2)
    trainer.train()
    trainer.train()
    assert [p.meta["steps"] for p in callback.profiles] == [2, 2]
    assert layerprof.load(tmp_path / "layerprof.json").meta["steps"] == 2
    assert layerprof.load(tmp_path / "layerprof-2.json").meta["steps"] == 2


def test_a_copy_made_or_saved_during_training_carries_nothing_of_the_callback(tmp_path: Path) -> None:
    # An EMA or best-model snapshot deep-copied in a callback, and torch.save(model) of the whole model: the
    # callback's check on the model was a closure in the model's hook dict, which every copy kept after the run
    # and which no pickle could save
    import copy
    import io

    model = _model()
    before = _hooks(model)
    seen: list[torch.nn.Module] = []

    class Snapshot(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 2:
                seen.append(copy.deepcopy(model))
                torch.save(model, io.BytesIO())

    trainer = _trainer(model, tmp_path, Tokens(), LayerProfCallback())
    trainer.add_callback(Snapshot())
    trainer.train()
    assert len(seen) == 1 and _hooks(seen[0]) == before and _hooks(model) == before
    torch.save(seen[0], io.BytesIO())
    assert layerprof.load(tmp_path / "layerprof.json").meta["steps"] == 4


def test_evaluate_alone_profiles_nothing(tmp_path: Path) -> None:
    model = _model()
    before = _hooks(model)
    callback = LayerProfCallback()
    metrics = _trainer(model, tmp_path, Tokens(), callback).evaluate(Tokens())
    assert metrics["eval_loss"] > 0
    assert callback.profile is None and not list(tmp_path.glob("layerprof*"))
    assert _hooks(model) == before and not _PROFILED


def test_max_steps_ends_inside_an_epoch_with_accumulation(tmp_path: Path) -> None:
    # 16 items in batches of 2 are 8 micro-batches per epoch; max_steps=2 with 3 per optimizer step stops after
    # 6 of them: each recorded step has 3 calls of the model.
    model = _model()
    callback = LayerProfCallback()
    trainer = _trainer(model, tmp_path, Tokens(), callback, max_steps=2, gradient_accumulation_steps=3)
    trainer.train()
    assert trainer.state.global_step == 2
    profile = callback.profile
    assert profile.meta["steps"] == 2 and profile.tree.calls == 3
    assert "partial" not in profile.meta
    # The root is the model the Trainer calls (with the labels, so the loss is inside it): it spans its modules.
    bert = profile.records["bert"]
    assert profile.tree.forward_ms >= bert.forward_ms > 0 and profile.tree.backward_ms >= bert.backward_ms > 0
    assert profile.layerwise_summary().startswith("Step: forward ") and "—" not in profile.layerwise_summary()[:80]


def test_the_partial_profile_of_a_run_that_raised_is_written_at_exit(tmp_path: Path) -> None:
    # A script that dies in train() touches nothing again: the interpreter's exit runs this (atexit).
    from layerprof.integrations.transformers import _end_runs_at_exit

    model = _model()
    before = _hooks(model)
    with pytest.raises(IndexError):
        _trainer(model, tmp_path, Tokens(fail_after=6), LayerProfCallback(), report_to=["tensorboard"]).train()
    assert not (tmp_path / "layerprof.json").exists()
    _end_runs_at_exit()
    saved = layerprof.load(tmp_path / "layerprof.json")
    assert saved.meta["steps"] == 2 and saved.meta["partial"] == OVER
    # TensorBoard says it too, beside the numbers.
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(tmp_path / "runs" / "layerprof"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("layerprof/partial/text_summary")
    assert text.tensor_proto.string_val[0].decode() == f"Partial profile (2 steps recorded): {OVER}"
    assert _hooks(model) == before and not _PROFILED
