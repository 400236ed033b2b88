"""The project's CI data beside the clone (``../shared``): real CUDA snapshots captured on GPUs.

It is not part of the repository, so a user's fresh clone has no ``../shared``: a test that needs it
calls :func:`require_shared` and is skipped with a one-line reason. ``.ci/run`` exports
``TBMEM_REQUIRE_SHARED=1``, under which the same absence is a failure: in CI nothing that needs the
shared data is skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["SHARED", "REAL", "REAL2", "REAL_PICKLES", "REQUIRE_ENV", "shared_present", "require_shared", "real_pickles"]

#: ``../shared`` of the repository (a clone's sibling folder in this project's CI).
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
#: Real torch snapshot pickles captured on GPUs by others (provenance and facts in their README.md).
REAL = SHARED / "snapshots" / "real"
REAL2 = SHARED / "snapshots" / "real2"
#: The pickles of REAL, named so that tests can be parametrized before the folder is looked at.
REAL_PICKLES = ("code_location_memory_snapshot.pickle", "kkaitlyn_memory_ctx128_fullstep.pickle",
                "magma27_memory_snapshot.pickle", "select_n_04d383c_snapshot.pickle")
#: The variable .ci/run exports: a missing ../shared fails the tests that need it instead of skipping them.
REQUIRE_ENV = "TBMEM_REQUIRE_SHARED"


def shared_present(path: Path = REAL) -> bool:
    """Whether ``path`` (a folder under ../shared) is there."""
    return path.is_dir()


def require_shared(path: Path = REAL) -> Path:
    """``path`` when present; else skip the test with the reason (fail under ``TBMEM_REQUIRE_SHARED=1``)."""
    __tracebackhide__ = True  # the skip is reported at the test that asked, not here
    if shared_present(path):
        return path
    try:
        shown = "../" + path.relative_to(SHARED.parent).as_posix()
    except ValueError:
        shown = str(path)
    reason = f"{shown} is not present (the project's CI data, not part of a clone)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}; {REQUIRE_ENV}=1 requires it")
    pytest.skip(reason)


def real_pickles(path: Path = REAL) -> list[Path]:
    """The ``*.pickle`` files of ``path``, sorted; skips (or fails) like :func:`require_shared` without it."""
    __tracebackhide__ = True
    folder = require_shared(path)
    return sorted(p for p in folder.iterdir() if p.name.endswith(".pickle"))
