"""Snapshots built by hand for the snapshot tests."""

from __future__ import annotations

from types import ModuleType

from tbmem._internal.snapshot.schema import Snapshot, SnapshotBuilder
from tests import _shared
from tests._extensions import not_built

__all__ = ["small_snapshot", "EVIL", "torch_dict", "REAL", "real_files", "native_module", "require_backend"]

EVIL = "<script>alert(1)</script>"
#: The real snapshots captured on GPUs by others (provenance and facts in their README.md); tests that
#: read them call :func:`tests._shared.require_shared` first (a skip in a clone, a failure in CI).
REAL = str(_shared.REAL)


def real_files() -> list[str]:
    """The real snapshot pickles, or [] where ../shared is not present (for collection-time use only:
    a test given none must still call :func:`tests._shared.require_shared`)."""
    if not _shared.shared_present():
        return []
    return [str(p) for p in _shared.real_pickles()]


def native_module() -> ModuleType:
    """The compiled CPU allocation recorder; the test skips where it cannot be built, and fails instead
    under ``TBMEM_REQUIRE_C_EXTENSION=1`` (set by .ci/run)."""
    from tbmem._internal.snapshot import native

    mod = native.load()
    if mod is None:
        not_built(f"CPU allocation recorder unavailable: {native.unavailable_reason()}")
    return mod


def require_backend(backend: str) -> None:
    """Skip (or fail, see :func:`native_module`) a test of the allocator backend where it is unavailable."""
    if backend == "allocator":
        native_module()


def small_snapshot(frame_name: str = "forward", n: int = 40) -> Snapshot:
    """n allocations of growing size, the first half freed in order: the peak is at event n - 1."""
    b = SnapshotBuilder(source="dispatch", device="cpu")
    idx = []
    for i in range(n):
        cat = "activation" if i % 2 else "backward"
        idx.append(b.alloc(1024 * (i + 1), category=cat, time_us=10 * i,
                           stack=[("/home/u/train.py", 10 + i % 3, frame_name), ("/home/u/main.py", 5, "main")]))
    for i in range(n // 2):
        b.free(idx[i], time_us=10 * (n + i))
    b.alloc(4096, category="parameter", preexisting=True)
    return b.build(kind="snapshot", step=7)


def torch_dict() -> dict:
    """Two devices in torch's format; cuda:1 ends in an out-of-memory error."""
    user = [{"filename": "/home/u/train.py", "line": 42, "name": "forward"}]
    t0 = 1_757_000_000_000_000

    def ev(action, addr, size, t, frames=user):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t0 + t, "frames": frames}

    dev0 = [ev("alloc", 0x1000, 512, 2), ev("alloc", 0x1200, 1024, 3), ev("free_requested", 0x1000, 512, 4),
            ev("free_completed", 0x1000, 512, 5)]
    oom = {"action": "oom", "device_free": 4096, "size": 1 << 30, "stream": 0, "time_us": t0 + 9, "frames": []}
    dev1 = [ev("alloc", 0x9000, 2048, 7), oom]
    seg = {"device": 0, "address": 0x1000, "total_size": 2 << 20, "blocks": [
        {"address": 0x1000, "size": 512, "requested_size": 512, "state": "inactive", "frames": []},
        {"address": 0x1200, "size": 1024, "requested_size": 1024, "state": "active_allocated", "frames": user}]}
    return {"segments": [seg], "device_traces": [dev0, dev1]}
