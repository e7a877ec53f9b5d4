"""Lightning, the Hugging Face Trainer and TensorBoard, for real, on CPU, a few steps each."""
from __future__ import annotations

import gc
import json
import os
import re
from unittest import mock
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from .conftest import TORCH_CALL_IMPL


def _small_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


# -- TensorBoard --------------------------------------------------------------------------------------------------
def _events(logdir: Path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def test_tensorboard_scalars_figures_and_text(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    net = _small_net()
    with LayerProf(net) as prof:
        net(torch.randn(4, 8)).sum().backward()
    tags = prof.to_tensorboard(tmp_path, step=7)
    events = _events(tmp_path)
    scalars = set(events.Tags()["scalars"])
    assert set(tags) == scalars
    for field in ("forward_ms", "backward_ms", "total_ms", "params"):
        for module in ("Sequential", "0", "1", "2"):
            assert f"layerprof/{field}/{module}" in scalars
    (point,) = events.Scalars("layerprof/forward_ms/0")
    assert point.step == 7 and point.value == pytest.approx(prof.profile.records["0"].forward_ms, rel=1e-6)
    (params,) = events.Scalars("layerprof/params/2")
    assert params.value == 17  # Linear(16, 1): 16 weights + 1 bias
    assert set(events.Tags()["images"]) == {"layerprof/sunburst", "layerprof/icicle", "layerprof/top"}
    (text,) = events.Tensors("layerprof/top/text_summary")
    assert text.tensor_proto.string_val[0].startswith(b"| Name | Type | Total | Forward | Backward | Time % | Params |\n")
    assert len(list(tmp_path.iterdir())) == 1  # one writer, one event file


def test_tensorboard_depth_and_top_and_a_given_writer(tmp_path: Path) -> None:
    summary = pytest.importorskip("torch.utils.tensorboard")
    net = nn.Sequential(_small_net(), nn.Linear(1, 1))
    with LayerProf(net) as prof:
        net(torch.randn(4, 8)).sum().backward()
    writer = summary.SummaryWriter(str(tmp_path))
    tags = prof.to_tensorboard(writer, depth=1, top=1)
    writer.close()
    modules = {tag.rsplit("/", 1)[1] for tag in tags}
    assert len(modules) == 2 and "Sequential" in modules  # the root and the top module at depth <= 1


# -- Lightning ----------------------------------------------------------------------------------------------------
try:  # at module level, like a real LightningModule (picklable for DDP workers)
    import lightning.pytorch as pl
except ImportError:  # the Lightning tests skip
    pl = None
else:
    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _small_net()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val", nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)


def _lightning_module():
    if pl is None:
        pytest.skip("needs lightning: pip install lightning")
    return pl, Regressor()


def _loader(batches: int):
    data = torch.utils.data.TensorDataset(torch.randn(4 * batches, 8), torch.randn(4 * batches, 1))
    return torch.utils.data.DataLoader(data, batch_size=4)


@pytest.mark.parametrize("accumulate", [1, 3])
def test_lightning_profiler(tmp_path: Path, accumulate: int) -> None:
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    profiler = LayerProfProfiler(schedule=layerprof.schedule(wait=1, active=4))
    trainer = pl.Trainer(max_epochs=1, profiler=profiler, accumulate_grad_batches=accumulate, default_root_dir=tmp_path,
                         limit_val_batches=2, val_check_interval=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, _loader(6), _loader(2))
    profile = profiler.profile_result
    # 6 batches: batch 0 waits, batches 1-4 recorded; validation between batches is never recorded.
    assert profile.meta["steps"] == 4
    assert profile.tree.calls == 1 and profile.records["net.0"].calls == 1  # one forward per batch
    assert profile.tree.forward_ms > 0 and profile.tree.backward_ms > 0
    saved = tmp_path / "layerprof-rank0.json"  # default dirpath: the trainer's log dir (default_root_dir)
    assert layerprof.load(saved).records["net.2"].type == "Linear"
    assert (tmp_path / "layerprof-rank0.txt").read_text().startswith("Step: forward")
    assert profiler.summary().startswith("Step: forward") and "(net): Sequential" in profiler.summary()
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in module.modules())  # nothing left on


def test_lightning_prints_the_summary_once(tmp_path: Path, capfd, caplog) -> None:
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    profiler = LayerProfProfiler(dirpath=tmp_path)
    trainer = pl.Trainer(max_epochs=1, profiler=profiler, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu")
    with caplog.at_level("INFO"):
        trainer.fit(module, _loader(3))
        print(profiler.summary())  # as the guide shows
    out, err = capfd.readouterr()
    shown = out + err + caplog.text
    # Once, from the print: the end of the fit only says where the files are (it used to log the summary too).
    assert shown.count("Step: forward") == 1 and shown.count("(net): Sequential") == 1
    assert f"layerprof: 3 training batches profiled; the summary is in {tmp_path / 'layerprof-rank0.txt'}" in shown


def test_lightning_ddp_on_cpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        # Lightning refuses to fork once this process initialized CUDA, and where none did yet its forked ranks
        # still take the CUDA RNG states (isolate_rng), which failed on an H100 machine: "Cannot re-initialize CUDA
        # in forked subprocess" (2026-11-27). ddp_fork on the CPU is for machines without a GPU.
        pytest.skip("ddp_fork on the CPU, on a machine with a GPU: Lightning's forked ranks initialize CUDA")
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    trainer = pl.Trainer(max_epochs=1, profiler=LayerProfProfiler(dirpath=tmp_path, filename="ddp"),
                         strategy="ddp_fork", accelerator="cpu", devices=2, limit_val_batches=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    # Lightning takes MASTER_PORT from the environment where it is set, else a free port, and leaves it set in
    # this process: a port of its own here, and the environment as it was for the worker's next tests.
    with mock.patch.dict(os.environ):
        os.environ.pop("MASTER_ADDR", None)
        os.environ.pop("MASTER_PORT", None)
        trainer.fit(module, _loader(4))
    for rank in (0, 1):
        profile = layerprof.load(tmp_path / f"ddp-rank{rank}.json")
        assert profile.meta["lightning"]["rank"] == rank
        assert profile.meta["steps"] == 2  # 4 batches split over 2 ranks
        # training_step calls self(x), inside DDP's call of the LightningModule: one call of each per batch
        assert profile.tree.calls == 1 and profile.records["net.0"].calls == 1
        assert profile.records["net.0"].backward_ms > 0


# -- Hugging Face Trainer -----------------------------------------------------------------------------------------
class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        return {"input_ids": torch.randint(0, 100, (8,), generator=generator), "labels": torch.tensor(index % 2)}


def _tiny_classifier(transformers, layers: int):
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    return transformers.BertForSequenceClassification(config)


def test_transformers_trainer_callback(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from layerprof.integrations.transformers import LayerProfCallback

    model = _tiny_classifier(transformers, layers=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3,
        report_to=["tensorboard"], use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=100)
    callback = LayerProfCallback(schedule=layerprof.schedule(warmup=1, active=2))
    transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[callback]).train()
    profile = callback.profile
    assert profile.meta["steps"] == 2  # 3 optimizer steps: 1 warm-up, 2 recorded
    assert profile.tree.calls == 2  # two micro-batches per optimizer step
    assert profile.records["bert.encoder.layer.1.attention"].calls == 2
    assert profile.records["classifier"].backward_ms > 0
    assert json.loads((tmp_path / "layerprof.json").read_text())["format"] == "layerprof.profile"
    assert "(bert): BertModel" in (tmp_path / "layerprof.txt").read_text()
    events = _events(tmp_path / "runs" / "layerprof")
    assert "layerprof/forward_ms/bert.encoder" in events.Tags()["scalars"]
    assert "layerprof/icicle" in events.Tags()["images"]


def test_the_integrations_check_their_options_as_they_are_made() -> None:
    # Checked at the first training step before (for Lightning after the sanity validation); a string was split into
    # letters ("unknown metric 'f'"); a schedule given in the path's place was written to after the whole run.
    pytest.importorskip("transformers")
    from layerprof.integrations.transformers import LayerProfCallback

    makers = [("LayerProfCallback", "output_dir", LayerProfCallback)]
    if pl is not None:
        from layerprof.integrations.lightning import LayerProfProfiler

        makers.append(("LayerProfProfiler", "dirpath", LayerProfProfiler))
    for owner, path_name, make in makers:
        with pytest.raises(TypeError, match=re.escape("metrics must be a sequence of names, not a string: write "
                                                      "metrics=('flops',)")):
            make(metrics="flops")
        with pytest.raises(ValueError, match="unknown metric 'bogus'; choose from: "):
            make(metrics=("bogus",))
        with pytest.raises(TypeError, match="schedule must be a layerprof.schedule"):
            make(schedule=5)
        with pytest.raises(TypeError, match=re.escape(f"{owner}: {path_name} must be a directory (a str or "
                                                      "os.PathLike) or None, got Schedule (a schedule goes by name")):
            make(layerprof.schedule(active=1))
        made = make(metrics=["flops"], schedule=layerprof.schedule(active=1))
        assert made.metrics == ("flops",)


def test_a_lightning_profiler_given_an_unknown_argument_says_only_that(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the TypeError, then at its collection "Exception ignored in: Profiler.__del__ ... AttributeError:
    # 'LayerProfProfiler' object has no attribute '_stage'" (Lightning's __del__ ran on the object never made).
    if pl is None:
        pytest.skip("needs lightning")
    from layerprof.integrations.lightning import LayerProfProfiler

    unraisable: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    with pytest.raises(TypeError, match="unexpected keyword argument 'warmup'"):
        LayerProfProfiler(warmup=1)
    gc.collect()
    assert unraisable == []


def test_two_callbacks_on_one_trainer_are_refused_as_training_begins(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from layerprof.integrations.transformers import LayerProfCallback

    model = _tiny_classifier(transformers, layers=1)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                          report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    steps: list[int] = []

    class Counts(transformers.TrainerCallback):
        def on_step_begin(self, *args, **kwargs) -> None:
            steps.append(1)

    first, second = LayerProfCallback(), LayerProfCallback(schedule=layerprof.schedule(wait=10, active=1))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[first, second, Counts()])
    with pytest.raises(ValueError, match="a Trainer takes one LayerProfCallback, and this one has 2"):
        trainer.train()
    assert steps == [] and vars(torch.nn.Module)["_call_impl"] is TORCH_CALL_IMPL  # before any step; nothing left on
    # One whose schedule never reaches its active steps in the run records none: no profile, no file.
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[second])
    trainer.train()
    assert second.profile is None and second.profiles == [] and not (tmp_path / "layerprof.json").exists()


# -- optional packages --------------------------------------------------------------------------------------------
def test_a_missing_package_names_what_installs_it() -> None:
    from layerprof.integrations import require

    with pytest.raises(ImportError) as raised:
        require("lightning_that_is_not_installed.pytorch", "lightning", "layerprof.integrations.lightning")
    message = str(raised.value)
    # layerprof is on no package index: the hint names the package, and the extra for a clone.
    assert message == ("layerprof.integrations.lightning needs 'lightning': pip install lightning "
                       '(from a clone of layerprof: pip install -e ".[lightning]")')
    assert "\n" not in message and '"layerprof[' not in message
    with pytest.raises(ImportError) as raised:  # the package is tensorboard, though the module is torch's
        require("torch.utils.tensorboard_that_is_not_there", "tensorboard", "to_tensorboard(logdir)")
    assert str(raised.value).startswith("to_tensorboard(logdir) needs 'tensorboard': pip install tensorboard (")
    with pytest.raises(ValueError, match="unknown extra 'lightnin'; choose from: lightning, transformers"):
        require("math", "lightnin", "x")


def test_the_install_hints_match_pyproject() -> None:
    import re
    import tomllib

    from layerprof.integrations._optional import EXTRAS

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    for extra, packages in EXTRAS.items():
        assert [re.split(r"[<>=!~\[ ]", requirement)[0] for requirement in extras[extra]] == list(packages)


def test_to_tensorboard_rejects_what_is_not_a_writer() -> None:
    net = _small_net()
    with LayerProf(net) as prof:
        net(torch.randn(4, 8)).sum().backward()
    with pytest.raises(TypeError, match="SummaryWriter or a log directory"):
        prof.to_tensorboard(42)


def test_a_folder_that_cannot_be_made_is_refused_as_the_integration_is_made(tmp_path: Path) -> None:
    """A file where the folder would go was found after the whole run, failing a training run that had finished
    and losing its profile (a sweep). It is refused as the callback or profiler is made; so is a Lightning
    ``filename`` with a folder in it, and ``filename=None`` takes the default stem, as Lightning's own profilers."""
    pytest.importorskip("transformers")
    from layerprof.integrations.transformers import LayerProfCallback

    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    makers = [("LayerProfCallback", "output_dir", LayerProfCallback)]
    if pl is not None:
        from layerprof.integrations.lightning import LayerProfProfiler

        makers.append(("LayerProfProfiler", "dirpath", LayerProfProfiler))
        with pytest.raises(ValueError, match=r"filename must be a file name stem .*got 'sub/x'"):
            LayerProfProfiler(filename="sub/x")
        assert LayerProfProfiler(filename=None).filename == "layerprof"
    for owner, path_name, make in makers:
        with pytest.raises(ValueError, match=re.escape(f"{owner}: {path_name} '{blocker / 'prof'}' cannot be a "
                                                       f"folder: '{blocker}' is a file")):
            make(blocker / "prof")
        make(tmp_path / "new" / "prof")  # a folder to be made: fine


def test_files_that_cannot_be_written_fail_neither_the_run_nor_leave_half_a_pair(tmp_path: Path) -> None:
    """A folder in the way of the summary (``layerprof-rank0.txt``) after the JSON was written: the fit raised at
    its end, and the JSON stayed with no path pointing to it. Now both files or neither, a warning, and the
    profile kept in ``profiler.profiles``."""
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    (tmp_path / "layerprof-rank0.txt").mkdir()
    profiler = LayerProfProfiler(dirpath=tmp_path)
    trainer = pl.Trainer(max_epochs=1, profiler=profiler, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    with pytest.warns(RuntimeWarning, match=r"LayerProfProfiler could not write the profile's files \("
                                            r"IsADirectoryError.*the profile is in profiler.profiles"):
        trainer.fit(module, _loader(3))
    assert trainer.state.finished and len(profiler.profiles) == 1 and profiler.paths == []
    assert not (tmp_path / "layerprof-rank0.json").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["layerprof-rank0.txt"]  # no temporary left


def test_each_runs_files_go_to_its_own_trainers_log_dir(tmp_path: Path) -> None:
    """Without a dirpath, the files go to the trainer's log dir: a second trainer's run wrote into the first's
    (Lightning's setup keeps a dirpath already set)."""
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    profiler = LayerProfProfiler()
    for root in ("first", "second"):
        trainer = pl.Trainer(max_epochs=1, profiler=profiler, default_root_dir=tmp_path / root, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             accelerator="cpu")
        trainer.fit(module, _loader(2))
    assert (tmp_path / "first" / "layerprof-rank0.json").exists()
    assert (tmp_path / "second" / "layerprof-rank0-2.json").exists()
    assert profiler.paths == [tmp_path / "second" / "layerprof-rank0-2.json", tmp_path / "second" /
                              "layerprof-rank0-2.txt"]


def test_a_run_before_the_schedules_active_steps_is_told_in_training_steps(tmp_path: Path) -> None:
    """The "recorded no step" warning spoke of LayerProf's own steps (a gap between each two training steps: 3
    batches read "steps 0 to 5"), of ``warmup=0`` where the schedule had ``warmup=1``, of an internal class, and of
    ``prof.step()``, which a trainer's user never calls."""
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    profiler = LayerProfProfiler(dirpath=tmp_path, schedule=layerprof.schedule(wait=3, warmup=1, active=2))
    trainer = pl.Trainer(max_epochs=1, profiler=profiler, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    with pytest.warns(RuntimeWarning) as caught:
        trainer.fit(module, _loader(3))
    texts = [str(w.message) for w in caught if "recorded no" in str(w.message)]
    assert texts == ["LayerProf recorded no training step: the run's 3 training steps all came before the "
                     "schedule's active ones (layerprof.schedule(wait=3, warmup=1, active=2)). Run more steps, or "
                     "change the schedule."]
    assert profiler.profiles == []


def test_a_dotted_filename_and_a_dirpath_set_by_hand_are_kept(tmp_path: Path) -> None:
    """``filename="exp.v2"`` wrote ``exp.json`` for every rank and run (``with_suffix`` took ``.v2-rank0`` for a
    suffix); a ``profiler.dirpath`` set by hand after a first run was replaced by the trainer's log dir (the second
    reading)."""
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    profiler = LayerProfProfiler(filename="exp.v2")
    for root in ("first", "second"):
        if root == "second":
            profiler.dirpath = str(tmp_path / "by_hand")
        trainer = pl.Trainer(max_epochs=1, profiler=profiler, default_root_dir=tmp_path / root, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             accelerator="cpu")
        trainer.fit(module, _loader(2))
    assert (tmp_path / "first" / "exp.v2-rank0.json").exists()
    assert profiler.paths == [tmp_path / "by_hand" / "exp.v2-rank0-2.json", tmp_path / "by_hand" / "exp.v2-rank0-2.txt"]


def test_the_no_step_note_tells_a_schedule_never_reached_from_calls_that_raised() -> None:
    from layerprof.integrations.steps import GapSchedule, checked_options

    assert GapSchedule.around(None).no_step_note(5) is None  # every step recorded: LayerProf's own words
    late = GapSchedule.around(layerprof.schedule(wait=3, active=1)).no_step_note(5)
    assert "the run's 3 training steps all came before the schedule's active ones" in late
    reached = GapSchedule.around(layerprof.schedule(active=3, repeat=1)).no_step_note(5)
    assert reached == ("LayerProf recorded no training step: every call in the active ones of the run's 3 training "
                       "steps (layerprof.schedule(active=3, repeat=1)) raised.")
    with pytest.raises(ValueError, match="holds a NUL character"):
        checked_options("LayerProfCallback", "output_dir", "a\0b", None, None)
    assert checked_options("LayerProfCallback", "output_dir", "~/prof", None, None)[0] == str(Path.home() / "prof")


def test_a_new_lightning_profiler_writes_beside_an_earlier_runs_files(tmp_path: Path) -> None:
    """A script run again with a new profiler into the same folder replaced the earlier run's files without a
    word (the numbering was per profiler): the second run now goes past the highest number already there."""
    pl, module = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    (tmp_path / "exp-rank1-3.json").write_text("{}")  # another rank's third run: the number is the job's
    (tmp_path / "exp-rank0-7").mkdir()  # (no .json/.txt file: not a run)
    for batches in (4, 2):
        profiler = LayerProfProfiler(dirpath=tmp_path, filename="exp")
        trainer = pl.Trainer(max_epochs=1, profiler=profiler, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                             limit_val_batches=0)
        trainer.fit(module, _loader(batches))
    assert profiler.paths == [tmp_path / "exp-rank0-5.json", tmp_path / "exp-rank0-5.txt"]
    assert layerprof.load(tmp_path / "exp-rank0-4.json").meta["steps"] == 4  # the first run's, kept
    assert layerprof.load(tmp_path / "exp-rank0-5.json").meta["steps"] == 2


def test_a_new_trainer_callback_writes_beside_an_earlier_runs_files(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from layerprof.integrations.transformers import LayerProfCallback

    for steps in (3, 2):
        args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=steps,
                                              report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                                              logging_strategy="no")
        callback = LayerProfCallback()
        transformers.Trainer(model=_tiny_classifier(transformers, layers=1), args=args, train_dataset=_Tokens(),
                             callbacks=[callback]).train()
    assert callback.paths == [tmp_path / "layerprof-2.json", tmp_path / "layerprof-2.txt"]
    assert layerprof.load(tmp_path / "layerprof.json").meta["steps"] == 3  # the first run's, kept
    assert layerprof.load(tmp_path / "layerprof-2.json").meta["steps"] == 2


def test_a_lightning_run_resumed_from_a_checkpoint_profiles_the_batches_an_uninterrupted_one_does(
        tmp_path: Path) -> None:
    """The schedule counted batches from the resumed ``fit()``: ``wait=6, active=4`` over 12 batches resumed after
    4 recorded batches 10 and 11 (2), where the uninterrupted run records 6 to 9 (4)."""
    pl, _ = _lightning_module()
    from layerprof.integrations.lightning import LayerProfProfiler

    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, limit_val_batches=0, accumulate_grad_batches=2)
    recorded = {}
    for name in ("uninterrupted", "resumed"):
        torch.manual_seed(0)
        module = _lightning_module()[1]
        ckpt_path = None
        if name == "resumed":  # 2 optimizer steps of 2 batches, saved, then resumed to the same 6 optimizer steps
            first = pl.Trainer(max_steps=2, **options)
            first.fit(module, _loader(8))
            ckpt_path = tmp_path / "half.ckpt"
            first.save_checkpoint(ckpt_path)
        profiler = LayerProfProfiler(dirpath=tmp_path / name, schedule=layerprof.schedule(wait=6, active=4, repeat=1))
        trainer = pl.Trainer(max_steps=6, profiler=profiler, **options)
        trainer.fit(module, _loader(8), ckpt_path=ckpt_path)
        assert trainer.global_step == 6
        recorded[name] = profiler.profile_result.meta
    assert recorded["uninterrupted"]["steps"] == recorded["resumed"]["steps"] == 4  # batches 6, 7, 8, 9
    assert recorded["resumed"]["schedule"]["first"] == 4 and recorded["uninterrupted"]["schedule"]["first"] == 0


def test_a_trainer_run_resumed_from_a_checkpoint_profiles_the_steps_an_uninterrupted_one_does(
        tmp_path: Path) -> None:
    """``wait=5, active=2`` over 8 optimizer steps resumed after 4 recorded nothing (the resumed train()'s steps
    counted from 0 reached only its 5th); it now records the training's steps 5 and 6, as an uninterrupted run."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from layerprof.integrations.transformers import LayerProfCallback

    def train(output_dir: Path, max_steps: int, callback: Any = None, resume: Any = None, save: bool = False) -> Any:
        args = transformers.TrainingArguments(
            output_dir=str(output_dir), per_device_train_batch_size=2, max_steps=max_steps, report_to=[],
            use_cpu=True, save_strategy="steps" if save else "no", save_steps=4, disable_tqdm=True,
            logging_strategy="no")
        trainer = transformers.Trainer(model=_tiny_classifier(transformers, layers=1), args=args,
                                       train_dataset=_Tokens(), callbacks=[callback] if callback else [])
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    schedule = layerprof.schedule(wait=5, active=2, repeat=1)
    uninterrupted = LayerProfCallback(schedule=schedule)
    train(tmp_path / "uninterrupted", 8, uninterrupted)
    train(tmp_path / "resumed", 4, save=True)
    resumed = LayerProfCallback(schedule=schedule)
    trainer = train(tmp_path / "resumed", 8, resumed, resume=str(tmp_path / "resumed" / "checkpoint-4"))
    assert trainer.state.global_step == 8
    assert uninterrupted.profile.meta["steps"] == 2
    assert resumed.profile is not None and resumed.profile.meta["steps"] == 2  # steps 5 and 6
    assert resumed.profile.meta["schedule"]["first"] == 4
