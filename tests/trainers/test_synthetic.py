"""SyntheticTrainer end to end on the quick config; losses and memory read back from the event files."""

from __future__ import annotations

import gc

import pytest
import torch

from tests._events import read_events, scalars
from trainers.experiment import run_experiment
from trainers.synthetic import rollout_loss


@pytest.mark.e2e  # the fast tier's one end-to-end run of this trainer (tests/slow.txt)
def test_quick_test_with_memory_monitoring(compose, tmp_path, capsys):
    cfg = compose("burgers_quick_test", "trainer=synthetic_with_memory", "tbmem.census_every=50")
    # The census counts every parameter the process holds, garbage not yet collected included: an earlier
    # test's model of this config in a reference cycle doubled parameters_MB once in the fast tier.
    gc.collect()
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    result = out.result
    epochs = cfg.trainer_params.epochs

    val = scalars(out.log_dir, "Loss/val")
    assert [s for s, _ in val] == list(range(epochs))
    assert [v for _, v in val] == pytest.approx(result.val_losses, rel=1e-6)
    assert val[-1][1] < 0.5 * val[0][1]  # the quality bar
    assert [v for _, v in scalars(out.log_dir, "Loss/train")] == pytest.approx(result.train_losses, rel=1e-6)
    lrs = [v for _, v in scalars(out.log_dir, "Train/learning_rate")]
    assert lrs[0] == pytest.approx(cfg.trainer_params.learning_rate) and lrs[-1] < lrs[0]  # cosine

    acc = read_events(out.log_dir)
    rss_steps = [e.step for e in acc.Scalars("Memory/RAM/process_rss_GB")]
    every = cfg.tbmem.every
    assert rss_steps == list(range(0, result.steps, every))
    census_steps = [e.step for e in acc.Scalars("Memory/Tensor_Census/total_MB")]
    assert census_steps == list(range(0, result.steps, 50))
    params_mb = acc.Scalars("Memory/Tensor_Category/parameters_MB")[0].value
    n_params = sum(p.numel() for p in torch.load(result.checkpoints[0], weights_only=True)["model"].values())
    assert params_mb == pytest.approx(n_params * 4 / 2**20, rel=1e-6)
    assert [e.step for e in acc.Scalars("Perf/batch_time_s")] == list(range(0, result.steps, every))
    norms = acc.Scalars("Train/grad_norm")  # the spike detector's gradient norm, with the other per-batch scalars
    assert [e.step for e in norms] == list(range(0, result.steps, every))
    assert all(0 < e.value < float("inf") for e in norms) and norms[-1].value < 0.5 * norms[0].value

    # synthetic_with_memory turns snapshots on: windowed recordings at the due steps, with the viewer
    snap = cfg.tbmem.snapshot
    due = [s for s in range(result.steps - snap.window + 1) if s % snap.every == 0]
    artifacts = sorted(p.name for p in (out.log_dir / "plugins" / "tbmem").glob("snapshot_*.json.gz"))
    kept = due[-snap.max_snapshots:]  # older ones are pruned; their scalars stay
    assert len(due) > len(kept) and artifacts == [f"snapshot_rank0_step{s:09d}.json.gz" for s in kept]
    assert all((out.log_dir / "plugins" / "tbmem" / a.replace(".json.gz", ".html")).exists() for a in artifacts)
    assert [e.step for e in acc.Scalars("Snapshot/events")] == due

    printed = capsys.readouterr().out
    assert "Batch 0:" in printed and "Epoch end:" in printed
    assert f"tensorboard --logdir {out.log_dir.parent}" in printed
    assert (out.log_dir / "checkpoints" / "best.pt").exists()


def test_monitoring_off_writes_losses_only(compose, tmp_path, capsys):
    cfg = compose("burgers_quick_test", "trainer_params.epochs=1", "data.num_sims=3",
                  "trainer_params.train_sim=[0]", "trainer_params.val_sim=[1]")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    tags = read_events(out.log_dir).Tags()["scalars"]
    assert sorted(tags) == ["Loss/train", "Loss/val", "Train/learning_rate"]
    assert "Batch 0:" not in capsys.readouterr().out


def test_gradient_accumulation_matches_a_large_batch(compose, tmp_path):
    # Two micro-batches of 4 with accumulation 2 give the same update as one batch of 8
    # (the mean of two equal-size means); plain SGD makes the update exact to compare.
    from trainers.config import validate
    from trainers.monitoring import TrainerMonitoring
    from trainers.synthetic import SyntheticTrainer

    weights = []
    for batch, accum in ((8, 1), (4, 2)):
        cfg = validate(compose("burgers_quick_test", "trainer_params.epochs=1", "data.num_sims=1",
                               "trainer_params.train_sim=[0]", "trainer_params.val_sim=[]",
                               "data.num_frames=12", f"trainer_params.batch_size={batch}",
                               f"trainer_params.gradient_accumulation_steps={accum}",
                               "trainer_params.optimizer=sgd", "trainer_params.scheduler=none"))
        mon = TrainerMonitoring.create(tmp_path / f"run{batch}", enabled=False, verbose_batches=0,
                                       tbmem_config=cfg.tbmem)
        trainer = SyntheticTrainer(cfg, monitoring=mon)
        trainer._loader = lambda ds, shuffle, t=trainer: torch.utils.data.DataLoader(  # fixed order
            ds, batch_size=t.params.batch_size, shuffle=False)
        trainer.train()
        mon.close()
        weights.append(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-4, atol=1e-6)


def test_rollout_loss_feeds_predictions_back():
    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    x0 = torch.zeros(2, 1, 4)
    targets = torch.zeros(2, 3, 1, 4)
    # predictions 1, 2, 3 -> MSE 1, 4, 9 -> mean 14/3
    assert rollout_loss(AddOne(), x0, targets).item() == pytest.approx(14 / 3)


@pytest.mark.parametrize("census_at", ["after_backward", "before_backward"])
def test_census_point_is_chosen_and_said(compose, tmp_path, census_at):
    import json

    from tests._events import texts

    cfg = compose("burgers_quick_test", "trainer=synthetic_with_memory", "trainer_params.epochs=1",
                  "data.num_sims=2", "trainer_params.train_sim=[0]", "trainer_params.val_sim=[1]",
                  "tbmem.census_every=1", "tbmem.snapshot.every=0", f"++trainer_params.census_at={census_at}")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    side = [json.loads(line) for line in (out.log_dir / "plugins" / "tbmem" / "census.jsonl").read_text().splitlines()]
    state = torch.load(out.result.checkpoints[0], weights_only=True)["model"]
    n_params = sum(p.numel() for p in state.values())
    later = side[1:]  # from the second census on, Adam's state exists
    adam = 2 * n_params * 4 + 4 * len(state)  # exp_avg, exp_avg_sq per parameter, a float32 step per tensor
    # by_module: the watched model's own parameters, gradients and optimizer state (other tests' models
    # may still be alive in this process and count in the categories)
    owned = [sum(c["by_module"].values()) for c in later]
    (_, text), *_ = texts(out.log_dir, "Memory/Large_Tensors/top_k")
    if census_at == "after_backward":  # the default: gradients and optimizer state show
        assert later and owned == [n_params * 4 * 2 + adam] * len(later)
        assert all(c["by_category"]["gradients"] >= n_params * 4 for c in side)
        assert "Taken after backward and the optimizer step, before zero_grad" in text
        assert side[0]["where"].startswith("after backward")
    else:  # the forward's saved activations, no gradients yet
        assert later and owned == [n_params * 4 + adam] * len(later)
        assert all(c["by_category"]["activations"] > 10 * n_params * 4 for c in side)
        assert "Taken before backward" in text


def test_progress_bar_counts_batches_with_loss_and_eta(compose, tmp_path, capsys):
    cfg = compose("burgers_quick_test", "trainer_params.epochs=2", "data.num_sims=2",
                  "trainer_params.train_sim=[0]", "trainer_params.val_sim=[1]", "trainer_params.progress=true")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    err = capsys.readouterr().err
    batches = out.result.steps
    assert batches > 2
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("epoch 2/2: 100%") and f"{batches}/{batches}" in final and "batch/s" in final
    assert "loss=" in final and "epoch train=" in final and "val=" in final
    assert f"/{batches} [" in err.split("epoch 2/2")[0]  # the first epoch already counted toward the run


def test_the_tensorboard_hint_works_outside_the_venv(monkeypatch, tmp_path):
    import sys
    from pathlib import Path

    from trainers.experiment import tensorboard_command

    beside = Path(sys.executable).with_name("tensorboard")
    assert beside.exists()  # installed with tbmem
    monkeypatch.setenv("PATH", str(tmp_path))  # a shell that never activated the venv
    command = tensorboard_command()
    assert command != "tensorboard" and Path(command).resolve() == beside.resolve()
    monkeypatch.setenv("PATH", str(beside.parent))
    assert tensorboard_command() == "tensorboard"


def test_ctrl_c_line_comes_after_the_progress_bar(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "run.py", "--config-name=burgers_quick_test", "trainer=synthetic_with_memory",
             f"runs_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}", "data.progress=false",
             "trainer_params.epochs=500", "tbmem.snapshot.every=0"],
            cwd=root, stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ, PYTHONPATH=str(root)),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 240
            while b"batch/s" not in err_path.read_bytes() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=120) == 130
        finally:
            proc.kill()
    lines = [ln for ln in err_path.read_text().replace("\r", "\n").splitlines() if ln.strip()]
    assert lines[-1].startswith("Interrupted (Ctrl-C): the run stopped at step ")  # not a bar redrawn after it
    assert any("batch/s" in ln for ln in lines[:-1])
