"""Simulation generation, the on-disk cache and its invalidation."""

from __future__ import annotations

import numpy as np
import pytest

from trainers.config import DataConfig
from trainers.data import cache_folder, data_hash, ensure_simulations, load_simulation


def _cfg(tmp_path, **kw):
    base = dict(resolution=16, num_frames=6, num_sims=3, cache_dir=str(tmp_path), progress=False)
    base.update(kw)
    return DataConfig(**base)


@pytest.mark.parametrize("pde, dim, channels", [("burgers", 1, 1), ("burgers", 2, 2), ("heat", 1, 1),
                                                ("heat", 2, 1)])
def test_shapes_and_time_evolution(tmp_path, pde, dim, channels):
    cfg = _cfg(tmp_path, pde=pde, dim=dim)
    folder = ensure_simulations(cfg)
    sims = [load_simulation(folder, i) for i in range(3)]
    assert sims[0].shape == (6, channels) + (16,) * dim
    assert sims[0].dtype == np.float32
    assert not np.allclose(sims[0], sims[1])  # each simulation has its own initial state
    assert not np.allclose(sims[0][0], sims[0][-1])  # the state evolves


def test_heat_matches_a_fourier_reference(tmp_path):
    # Explicit diffusion of one sine mode decays each step by 1 - 4 nu dt / dx^2 sin^2(k dx / 2).
    cfg = _cfg(tmp_path, pde="heat", dim=1, num_sims=1, nu=0.1, resolution=32)
    data = load_simulation(ensure_simulations(cfg), 0)[:, 0]
    dx = cfg.domain_size / cfg.resolution
    spectrum = np.fft.rfft(data, axis=-1)
    for k in (1, 2, 3):
        factor = 1 - 4 * cfg.nu * cfg.dt / dx**2 * np.sin(k * dx / 2) ** 2
        np.testing.assert_allclose(spectrum[1:, k], spectrum[:-1, k] * factor, rtol=1e-4, atol=1e-5)


def test_cache_is_not_regenerated(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    ensure_simulations(cfg)
    import trainers.data as data

    monkeypatch.setattr(data, "initial_state", lambda *a, **k: pytest.fail("regenerated"))
    assert ensure_simulations(cfg) == cache_folder(cfg)


def test_changed_config_regenerates(tmp_path):
    a, b = _cfg(tmp_path), _cfg(tmp_path, nu=0.02)
    assert data_hash(a) != data_hash(b)
    fa, fb = ensure_simulations(a), ensure_simulations(b)
    assert fa != fb
    # Same initial states (same seed), different viscosity: frame 0 equal, later frames differ.
    sa, sb = load_simulation(fa, 0), load_simulation(fb, 0)
    np.testing.assert_array_equal(sa[0], sb[0])
    assert not np.allclose(sa[-1], sb[-1])


def test_loading_keys_do_not_change_the_hash(tmp_path):
    assert data_hash(_cfg(tmp_path)) == data_hash(_cfg(tmp_path / "x", max_cached_sims=1, pin_memory=True))


def test_incomplete_cache_is_regenerated(tmp_path):
    cfg = _cfg(tmp_path)
    folder = ensure_simulations(cfg)
    (folder / "meta.json").unlink()
    (folder / "sim_0001.npy").unlink()
    ensure_simulations(cfg)
    assert (folder / "sim_0001.npy").exists() and (folder / "meta.json").exists()


def test_unstable_explicit_diffusion_is_refused(tmp_path):
    with pytest.raises(ValueError, match="data.substeps"):
        ensure_simulations(_cfg(tmp_path, nu=1.0, resolution=64))


def _fresh_python(code: str) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root,
                         env=dict(os.environ, PYTHONPATH=str(root)))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_phiml_log_line_appears_once_under_a_root_handler():
    """As under Hydra: the root logger prints records; PhiML's own handler printed them again, with an "n"."""
    stdout = _fresh_python(
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='[%(name)s] %(message)s')\n"
        "from trainers.data import phi_flow, select_backend_device\n"
        "select_backend_device('cpu'); phi_flow()\n")
    lines = [ln for ln in stdout.splitlines() if "default backend" in ln]
    assert lines == ["[Φ-ML] Φ-ML's default backend is now torch"]
    assert stdout.count("backend is now") == 1 and "(INFO)" not in stdout


def test_phiml_log_line_is_plain_without_a_root_handler():
    stdout = _fresh_python(
        "import logging\n"
        "logging.getLogger('Φ-ML').setLevel(logging.INFO)\n"
        "from trainers.data import phi_flow, select_backend_device\n"
        "select_backend_device('cpu'); phi_flow()\n")
    assert "Φ-ML's default backend is now torch\n" in stdout
    assert "(INFO)" not in stdout and "torchn" not in stdout and not stdout.rstrip("\n").endswith("n")
