"""Leak detection: exact slopes on known series, no flag for jumps/warm-up/noise, and real loops."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tbmem.analysis import detect_leaks
from tbmem._internal.analysis.leaks import leak_tag_kind
from tests.analysis._loops import LEAKS, train

ACT = "Memory/Tensor_Category/activations_MB"
RSS = "Memory/RAM/process_rss_GB"
STEPS = np.arange(0, 1000, 50)  # 20 records, like a census every 50 steps


def frame(series: dict[str, np.ndarray], run: str = "r") -> pd.DataFrame:
    parts = [pd.DataFrame({"run": run, "tag": tag, "step": STEPS, "wall_time": 0.0, "value": values})
             for tag, values in series.items()]
    return pd.concat(parts, ignore_index=True)


def test_linear_growth_is_flagged_with_exact_evidence():
    (f,) = detect_leaks(frame({ACT: 10.0 + 0.5 * STEPS}))
    assert f.flagged and f.category == "activations" and f.kind == "exact"
    assert f.slope_mb_per_1k == pytest.approx(500.0)
    assert f.low_mb_per_1k == pytest.approx(500.0) and f.high_mb_per_1k == pytest.approx(500.0)
    # the warm-up is the first quarter of the step range 0..950: the window starts at step 250
    assert (f.start_step, f.end_step, f.n_points) == (250, 950, 15)
    assert (f.start_mb, f.end_mb) == (10.0 + 125.0, 10.0 + 475.0)
    assert "+500.0 MB/1k steps" in f.describe()


def test_flat_noisy_and_unrelated_series_are_not_flagged():
    rng = np.random.default_rng(0)
    df = frame({ACT: np.full(len(STEPS), 7.0), RSS: 0.5 + rng.normal(0, 0.01, len(STEPS)),
                "Loss/train": 0.5 * STEPS})
    assert detect_leaks(df) == []
    clean = detect_leaks(df, include_clean=True)
    assert sorted(f.tag for f in clean) == [RSS, ACT]  # Loss/* is not memory: never judged
    assert not any(f.flagged for f in clean)


def test_one_jump_is_not_steady_growth():
    values = np.where(STEPS >= 600, 300.0, 100.0)  # a buffer allocated once, mid-window
    (f,) = detect_leaks(frame({ACT: values}), include_clean=True)
    assert not f.flagged and f.growth_mb == 200.0


def test_growth_during_warmup_is_ignored():
    values = np.minimum(STEPS, 200) * 1.0  # grows 1 MB/step until step 200, then flat
    (f,) = detect_leaks(frame({ACT: values}), include_clean=True)
    assert not f.flagged and f.slope_mb_per_1k == 0.0
    (f,) = detect_leaks(frame({ACT: values}), include_clean=True, skip_fraction=0.0)
    assert f.start_step == 0


def test_noisy_tags_have_their_own_threshold():
    mb_per_step = 0.05  # 50 MB per 1000 steps
    df = frame({ACT: mb_per_step * STEPS, RSS: 0.4 + mb_per_step * STEPS / 1024})
    flagged = detect_leaks(df)
    assert [f.tag for f in flagged] == [ACT]
    (rss,) = [f for f in detect_leaks(df, include_clean=True) if f.tag == RSS]
    assert rss.slope_mb_per_1k == pytest.approx(50.0, rel=1e-5) and rss.threshold_mb_per_1k == 100.0
    assert sorted(f.tag for f in detect_leaks(df, noisy_threshold_mb_per_1k=40.0)) == [RSS, ACT]
    assert detect_leaks(df, threshold_mb_per_1k=60.0) == []


def test_too_few_points_are_not_judged_and_bad_options_raise():
    df = frame({ACT: 0.5 * STEPS})
    assert detect_leaks(df.head(4)) == []  # 4 records, 3 after the warm-up
    with pytest.raises(ValueError, match="skip_fraction"):
        detect_leaks(df, skip_fraction=1.0)
    with pytest.raises(ValueError, match="threshold_mb_per_1k"):
        detect_leaks(df, threshold_mb_per_1k=0)
    with pytest.raises(ValueError, match="min_points"):
        detect_leaks(df, min_points=2)


def test_tag_kinds():
    assert leak_tag_kind("Memory/Tensor_Category/gradients_MB") == "exact"
    assert leak_tag_kind("Memory/GPU/vram_allocated_GB") == "exact"
    assert leak_tag_kind("Memory/GPU/vram_reserved_GB") == "noisy"
    assert leak_tag_kind("System/ram_used_GB") is None  # other processes move it
    assert leak_tag_kind("Perf/step_time_ms") is None


# --- real training loops ----------------------------------------------------------------

@pytest.mark.parametrize("leak", LEAKS)
def test_real_leaks_are_flagged(tmp_path, leak):
    logdir = train(tmp_path / leak, leak=leak)
    flagged = detect_leaks(logdir)
    assert flagged, [f.describe() for f in detect_leaks(logdir, include_clean=True)]
    assert all(f.slope_mb_per_1k > f.threshold_mb_per_1k for f in flagged)
    judged = detect_leaks(logdir, include_clean=True)
    if any(f.category for f in judged):  # the census ran: its exact bytes must show the leak
        assert any(f.category for f in flagged), [f.describe() for f in judged]
    else:  # no census (monitoring without it): process RSS must show it
        assert RSS in {f.tag for f in flagged}, [f.describe() for f in judged]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clean_loops_are_not_flagged(tmp_path, seed):
    logdir = train(tmp_path / f"clean{seed}", seed=seed)
    judged = detect_leaks(logdir, include_clean=True)
    assert RSS in {f.tag for f in judged}  # the run was long enough to be judged
    assert [f.describe() for f in judged if f.flagged] == []
