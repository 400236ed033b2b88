"""Builds and loads the CPU allocation recorder (``_cpu_alloc_recorder.cpp``) for the installed torch.

The recorder wraps torch's CPU allocator, so it must be compiled against the headers of the torch that
runs it. It is compiled once per torch, Python and source version, on first use (about 3 s with g++)
or by ``tbmem snapshot build-recorder`` (``make install`` runs it), into a per-user cache:
``$TBMEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tbmem``, else ``~/.cache/tbmem``. Where it cannot be built
(no C++ compiler, no torch headers, not Linux, a free-threaded Python), :func:`load` returns None,
:func:`unavailable_reason` says why, and CPU snapshots use the dispatch-mode recorder instead.

Example:
    >>> from tbmem._internal.snapshot import native
    >>> mod = native.load()
    >>> mod is None or mod.installed() in (True, False)
    True
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

from tbmem._internal._log import logger

__all__ = ["NativeUnavailable", "SOURCE", "build", "cache_dir", "library_path", "load", "loaded",
           "unavailable_reason"]

SOURCE = Path(__file__).with_name("_cpu_alloc_recorder.cpp")
_MODULE = "_cpu_alloc_recorder"
_lock = threading.Lock()
_loaded: ModuleType | None = None
_reason: str | None = None
_tried = False


class NativeUnavailable(RuntimeError):
    """The CPU allocation recorder cannot be built or loaded here; the message says why."""


def cache_dir() -> Path:
    """Where compiled recorders are kept (see the module docstring)."""
    if os.environ.get("TBMEM_CACHE_DIR"):
        return Path(os.environ["TBMEM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tbmem"


def _torch_paths() -> tuple[Path, Path, int]:
    import torch

    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib", int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))


def library_path() -> Path:
    """The compiled recorder for this torch, Python and source (it may not exist yet)."""
    import torch

    include, _, abi = _torch_paths()
    key = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, str(include), sys.version, str(abi)):
        key.update(b"\0" + part.encode())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_dir() / f"{_MODULE}-{key.hexdigest()[:16]}{suffix}"


def _check_platform() -> None:
    if not sys.platform.startswith("linux"):
        raise NativeUnavailable(f"the CPU allocation recorder is built on Linux only (this is {sys.platform})")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        raise NativeUnavailable("the CPU allocation recorder needs the GIL (this Python is free-threaded)")


def build(*, force: bool = False) -> Path:
    """Compile the recorder into :func:`library_path` (if it is not there yet); return its path.

    Raises:
        NativeUnavailable: no C++ compiler, no torch headers, another platform, or the compiler failed
            (the message holds the end of its output).
    """
    _check_platform()
    out = library_path()
    if out.exists() and not force:
        return out
    include, lib, abi = _torch_paths()
    if not (include / "c10" / "core" / "CPUAllocator.h").is_file():
        raise NativeUnavailable(f"torch's C++ headers are not installed ({include} has no c10/core/CPUAllocator.h)")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not compiler:
        raise NativeUnavailable("no C++ compiler found (install g++, or set CXX)")
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # each builder writes its own file and renames it: ranks building at once never see half a library
    fd, tmp = tempfile.mkstemp(prefix=f".{_MODULE}-", suffix=".so", dir=out.parent)
    os.close(fd)
    errors = []
    try:
        for std in ("c++20", "c++17"):
            cmd = [compiler, "-O2", f"-std={std}", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                   "-I", str(include), "-I", sysconfig.get_paths()["include"], str(SOURCE), "-L", str(lib),
                   "-lc10", f"-Wl,-rpath,{lib}", "-o", tmp]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            except (OSError, subprocess.SubprocessError) as exc:
                raise NativeUnavailable(f"cannot run the C++ compiler {compiler!r}: {exc}") from exc
            if proc.returncode == 0:
                os.replace(tmp, out)
                return out
            errors.append(f"-std={std}: {proc.stderr.strip()[-800:]}")
        raise NativeUnavailable("compiling the CPU allocation recorder failed: " + " | ".join(errors))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(*, build_if_missing: bool = True) -> ModuleType | None:
    """The recorder module with its allocator wrapper installed, or None (see :func:`unavailable_reason`).

    Tried once per process (a call that found it not built and was told not to build does not count);
    ``TBMEM_NATIVE_RECORDER=0`` switches it off.
    """
    global _loaded, _reason, _tried
    with _lock:
        if _tried:
            return _loaded
        try:
            if os.environ.get("TBMEM_NATIVE_RECORDER", "1") == "0":
                _tried = True
                raise NativeUnavailable("switched off by TBMEM_NATIVE_RECORDER=0")
            _check_platform()
            path = library_path()
            if not path.exists() and not build_if_missing:
                _reason = f"not built yet ({path}); run: tbmem snapshot build-recorder"
                return None
            _tried = True
            if not path.exists():
                logger.warning("tbmem: compiling the CPU snapshot recorder for this torch, once (a few seconds; "
                               "`tbmem snapshot build-recorder` does it ahead of training)")
                build()
            spec = importlib.util.spec_from_file_location(_MODULE, path)
            if spec is None or spec.loader is None:
                raise NativeUnavailable(f"cannot load {path}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            if not mod.install():
                raise NativeUnavailable("torch's CPU allocator could not be wrapped")
            _loaded = mod
        except (NativeUnavailable, OSError, ImportError, subprocess.SubprocessError) as exc:
            _tried = True
            _reason = str(exc)
        return _loaded


def loaded() -> ModuleType | None:
    """The recorder module if :func:`load` loaded it already, else None (never loads or builds)."""
    return _loaded


def unavailable_reason() -> str | None:
    """Why :func:`load` returned None (None when it did not, or was not called)."""
    return _reason


def main() -> int:
    """``tbmem snapshot build-recorder``: build the recorder now; exit 1 (with the reason) if it cannot be."""
    t0 = time.perf_counter()
    try:
        path = build()
    except NativeUnavailable as exc:
        print(f"tbmem: CPU allocation recorder not built: {exc}", file=sys.stderr)
        return 1
    print(f"tbmem: CPU allocation recorder ready in {time.perf_counter() - t0:.1f} s: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
