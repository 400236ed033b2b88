"""The real CUDA snapshots of ../shared/snapshots/real and real2, and the facts their README.md measured.

A clone has no ``../shared``: :func:`require` skips with the reason, and fails instead under
``TBMEM_REQUIRE_SHARED=1`` (what .ci/run sets), through :func:`tests._shared.require_shared`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests import _shared

__all__ = ["REAL", "REAL2", "ALL", "REAL2_FACTS", "require", "path_of"]

REAL = str(_shared.REAL)
REAL2 = str(_shared.REAL2)
#: Every real snapshot, named so that tests can be parametrized before the folders are looked at.
ALL = ("real/code_location_memory_snapshot.pickle", "real/kkaitlyn_memory_ctx128_fullstep.pickle",
       "real/magma27_memory_snapshot.pickle", "real/select_n_04d383c_snapshot.pickle",
       "real2/bcrafton_memory_snapshot.pickle", "real2/decomfl_memory.pickle",
       "real2/flexgen_6a8eab0_1.3b_snapshot.pickle", "real2/octreenca_752276c_my_snapshot.pickle",
       "real2/sqattn_cuda_memory_snapshot.pickle", "real2/tritonunfold_memory.pickle", "real2/verl_mem.pickle")
MiB = 2**20
#: real2/README.md: reserved, alive before the trace, peak, trace events, and the largest allocation
#: with a user frame (bytes, function, path end, line; None: no frames recorded)
REAL2_FACTS = {
    "verl_mem.pickle": (26_189_234_176, 25_483_614_352, 25_483_614_352, 0,
                        (865.1 * MiB, "_allocate_kv_cache", "vllm/worker/cache_engine.py", 83)),
    "tritonunfold_memory.pickle": (69_206_016, 23_031_360, 23_031_360, 0, None),
    "flexgen_6a8eab0_1.3b_snapshot.pickle": (7_608_467_456, 5_692_346_376, 5_692_346_376, 1,
                                             (196.4 * MiB, "allocate", "flexgen/pytorch_backend.py", 195)),
    "bcrafton_memory_snapshot.pickle": (4_238_344_192, 3_064_418_304, 3_849_232_640, 6_486,
                                        (147.2 * MiB, "step", "cs336_basics/optimizer.py", 75)),
    "octreenca_752276c_my_snapshot.pickle": (9_196_011_520, 186_240, 5_692_437_840, 902,
                                             (1.39 * 2**30, "forward_cuda", "src/models/Model_BasicNCA2D_fast.py", 95)),
    "decomfl_memory.pickle": (1_897_922_560, 0, 1_783_664_516, 23_105,
                              (147.3 * MiB, "update_K_param_paramwise", "cezo_fl/gradient_estimators/adam_forward.py",
                               268)),
    "sqattn_cuda_memory_snapshot.pickle": (230_686_720, 215_105_536, 4_351_237_120, 9_576,
                                           (1.01 * 2**30, "forward", "transformers/models/qwen2/modeling_qwen2.py", 54)),
}


def require(folder: str = REAL2) -> str:
    """``folder`` when present; else skip with the reason (fail under ``TBMEM_REQUIRE_SHARED=1``)."""
    __tracebackhide__ = True
    return str(_shared.require_shared(Path(folder)))


def path_of(name: str) -> str:
    """The path of ``real/x.pickle`` or ``real2/x.pickle`` (skipping or failing like :func:`require`)."""
    folder, base = name.split("/")
    return os.path.join(require(REAL if folder == "real" else REAL2), base)
