"""Simulation data: Burgers (1D/2D) and heat generated with PhiFlow, cached on disk.

All simulations of a config are advanced together as one batch with a jitted
step. Each simulation is stored as ``sim_XXXX.npy`` (``[frames, channels, *space]``,
float32) in ``<cache_dir>/<pde>_<dim>d_<hash>/``, where the hash covers every key
that changes the numbers; a changed config therefore gets a fresh folder and
an unchanged one is reused. Files are written to a temporary name first so an
interrupted run never leaves a half-written cache that looks complete.

Burgers advects semi-Lagrangian in 2D; 1D uses ``advect.differential``
because phiml 1.16.1's 1D semi-Lagrangian advection is broken on torch (see
docs/trainers.md). Diffusion is explicit (stability is checked up front).

Example:
    >>> import tempfile
    >>> from trainers.config import DataConfig
    >>> from trainers.data import ensure_simulations, load_simulation
    >>> cfg = DataConfig(resolution=32, num_frames=5, num_sims=2, cache_dir=tempfile.mkdtemp(),
    ...                  progress=False)
    >>> folder = ensure_simulations(cfg)
    >>> load_simulation(folder, 1).shape
    (5, 1, 32)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainers.config import DataConfig

__all__ = ["data_hash", "cache_folder", "ensure_simulations", "load_simulation", "make_step",
           "initial_state", "channels", "phi_flow", "select_backend_device"]

# Keys that do not change the simulated numbers stay out of the hash.
_NOT_HASHED = {"cache_dir", "max_cached_sims", "pin_memory", "progress"}
_FORMAT_VERSION = 1


def data_hash(cfg: DataConfig) -> str:
    """A short hash of every config key that changes the simulated data."""
    keys = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_HASHED}
    keys["_format"] = _FORMAT_VERSION
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:12]


def cache_folder(cfg: DataConfig) -> Path:
    """The folder holding this config's simulations."""
    return Path(cfg.cache_dir) / f"{cfg.pde}_{cfg.dim}d_{data_hash(cfg)}"


def channels(cfg: DataConfig) -> int:
    """Channels per state: Burgers has a velocity vector, heat a scalar temperature."""
    return cfg.dim if cfg.pde == "burgers" else 1


def phi_flow() -> Any:
    """``phi.torch.flow``: importing it makes torch phiml's default backend."""
    _phiml_log_once()
    from phi.torch import flow

    return flow


def _phiml_log_once() -> None:
    """PhiML's log lines once, without its stray "n".

    PhiML gives its logger a stdout handler of its own whose format ends in ``n\\n`` (a typo for
    a newline) and lets the records propagate too: under Hydra, whose root handler prints them
    as well, each line appeared twice. Where the root logger has handlers (Hydra: console and
    ``run.log``) PhiML's own is removed; elsewhere it is kept with a plain format.
    """
    import logging

    from phiml.backend import _backend

    handler = getattr(_backend, "_LOG_CONSOLE_HANDLER", None)
    ml_logger = logging.getLogger("Φ-ML")
    if handler is None or handler not in ml_logger.handlers:
        return
    if logging.getLogger().handlers:
        ml_logger.removeHandler(handler)
    else:
        handler.setFormatter(logging.Formatter("%(message)s"))


def select_backend_device(device: str) -> str:
    """Make phiml's torch backend use ``device`` ('cpu' or 'cuda'); return phiml's name for it.

    The torch backend would otherwise put tensors on the GPU whenever CUDA exists.
    """
    _phiml_log_once()
    from phiml.backend.torch import TORCH

    name = "GPU" if device == "cuda" else "CPU"
    TORCH.set_default_device(name)
    return name


def _space(cfg: DataConfig) -> dict[str, int]:
    return {"x": cfg.resolution} if cfg.dim == 1 else {"x": cfg.resolution, "y": cfg.resolution}


def initial_state(cfg: DataConfig, batch_size: int) -> Any:
    """A batch of smooth random initial states (a PhiFlow ``CenteredGrid``)."""
    flow = phi_flow()
    space = _space(cfg)
    bounds = flow.Box(**{d: cfg.domain_size for d in space})
    shape = flow.batch(b=batch_size)
    if cfg.pde == "burgers":
        shape = shape & flow.channel(vector=",".join(space))
    noise = flow.Noise(shape, scale=cfg.noise_scale, smoothness=cfg.noise_smoothness)
    grid = flow.CenteredGrid(noise, flow.PERIODIC, bounds=bounds, **space)
    return grid * cfg.amplitude


def make_step(cfg: DataConfig) -> Callable[[Any, Any], Any]:
    """The un-jitted time step ``step(state, nu) -> state`` of ``cfg.pde``.

    ``nu`` may be a float or a PhiML tensor (the PhysicalTrainer differentiates through it).
    """
    flow = phi_flow()
    dt = cfg.dt / cfg.substeps

    def burgers(u: Any, nu: Any) -> Any:
        for _ in range(cfg.substeps):
            u = flow.diffuse.explicit(u, nu, dt)
            if cfg.dim == 1:
                u = u + dt * flow.advect.differential(u, u)
            else:  # unconditionally stable where central differences oscillate (cell Reynolds > 2)
                u = flow.advect.semi_lagrangian(u, u, dt)
        return u

    def heat(t: Any, nu: Any) -> Any:
        for _ in range(cfg.substeps):
            t = flow.diffuse.explicit(t, nu, dt)
        return t

    return burgers if cfg.pde == "burgers" else heat


def _check_stability(cfg: DataConfig) -> None:
    dx = cfg.domain_size / cfg.resolution
    number = cfg.nu * (cfg.dt / cfg.substeps) / dx**2
    limit = 0.5 if cfg.dim == 1 else 0.25
    if number > limit:
        raise ValueError(f"config key 'data.substeps' too small: explicit diffusion is unstable "
                         f"(nu*dt/dx^2 = {number:.3f} > {limit}); raise data.substeps or lower data.dt")


def _grid_to_numpy(grid: Any, cfg: DataConfig) -> np.ndarray:
    space = ",".join(_space(cfg))
    order = f"b,vector,{space}" if cfg.pde == "burgers" else f"b,{space}"
    arr = np.asarray(grid.values.numpy(order), dtype=np.float32)
    return arr if cfg.pde == "burgers" else arr[:, None]


def ensure_simulations(cfg: DataConfig) -> Path:
    """Generate the simulations of ``cfg`` unless a complete cache exists; return its folder."""
    folder = cache_folder(cfg)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        return folder
    _check_stability(cfg)
    flow = phi_flow()
    flow.math.seed(cfg.seed)
    folder.mkdir(parents=True, exist_ok=True)
    state = initial_state(cfg, cfg.num_sims)
    step = flow.jit_compile(make_step(cfg))
    frames = np.empty((cfg.num_frames, cfg.num_sims, channels(cfg)) + (cfg.resolution,) * cfg.dim,
                      dtype=np.float32)
    frames[0] = _grid_to_numpy(state, cfg)
    bar = _progress(cfg, f"simulating {cfg.num_sims} {cfg.pde} {cfg.dim}D")
    with warnings.catch_warnings():
        # phiml's jit traces with torch.jit.trace, deprecated in recent torch; nothing to fix here.
        warnings.filterwarnings("ignore", message=".*torch.jit.trace.* is deprecated", category=DeprecationWarning)
        for f in range(1, cfg.num_frames):
            state = step(state, cfg.nu)
            frames[f] = _grid_to_numpy(state, cfg)
            bar.update(1)
    bar.close()
    if not np.isfinite(frames).all():
        raise ValueError("the simulation diverged (non-finite values); lower data.dt or data.amplitude")
    for i in range(cfg.num_sims):
        tmp = folder / f".sim_{i:04d}.tmp.npy"
        np.save(tmp, np.ascontiguousarray(frames[:, i]))
        os.replace(tmp, folder / f"sim_{i:04d}.npy")
    tmp_meta = folder / ".meta.tmp"
    tmp_meta.write_text(json.dumps({"config": dataclasses.asdict(cfg), "hash": data_hash(cfg),
                                    "shape": list(frames.shape[2:])}, indent=1))
    os.replace(tmp_meta, meta_path)  # written last: its presence marks the cache complete
    return folder


def _progress(cfg: DataConfig, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=cfg.num_frames - 1, desc=desc, unit="frame", disable=not cfg.progress,
                leave=False)


def load_simulation(folder: str | os.PathLike[str], index: int) -> np.ndarray:
    """One simulation as ``[frames, channels, *space]`` float32 (no pickle is ever loaded)."""
    return np.load(Path(folder) / f"sim_{index:04d}.npy", allow_pickle=False)
