"""Which frame of a stack is the user's line: decided from where packages really are, not substrings.

A frame is C++ (no Python source file: ``??``, ``RegisterCUDA.cpp``), *internal* C++ (the
stack capture's own frames such as ``torch::unwind::unwind()``, the caching allocator's, the
CPython interpreter's ``_PyEval_*``/``PyObject_*``: never worth showing), library Python
(inside an installed package tbmem treats as machinery: torch, functorch, tbmem, PhiFlow's
``phi``/``phiml``, the standard library, and every ``site-packages`` package when asked),
*generated* Python (torch.compile's ``/tmp/torchinductor_<user>/...py`` files, FX's
``<eval_with_key>``), or user Python. The user frame of a stack is its innermost user
Python frame: neither C++ nor generated frames are chosen, so an allocation in compiled code
is named by the model's own line that the snapshot carries after the generated frame
(torch adds it from the FX graph's node, or the caller of the compiled module).

Where the packages are is known three ways: from this interpreter (``importlib`` finds
torch, tbmem, ... without importing them; ``sysconfig`` names the standard library and
``site-packages``), from the roots a tbmem recording stored in its metadata, and, for
snapshots captured on other machines, from the file paths themselves: a path
``<prefix>/site-packages/torch/...`` is torch installed under ``<prefix>``, whose
``<prefix>/..`` (``lib/python3.X``) is that interpreter's standard library, a
``lib/python3.X`` folder or an interpreter's ``Lib`` folder (``cpython-3.10.19-windows...``,
``Python311``, ``3.10.4``) holding a standard-library module (``copy.py``) is a standard
library wherever the interpreter lives (uv, pyenv, Windows installs), and a folder holding
torch's own files (``nn/modules/module.py``, ``_tensor.py``) is a torch checkout. A folder
merely *named* ``tbmem`` or ``torch`` (a clone of this repository, a user's script folder) is
none of these, so user frames in it are found.

Example:
    >>> from tbmem._internal.snapshot.frames import FrameClassifier
    >>> fc = FrameClassifier.for_paths(["/env/lib/python3.11/site-packages/torch/nn/modules/module.py"])
    >>> [fc.kind(p) for p in ("/env/lib/python3.11/site-packages/torch/_tensor.py",
    ...                       "/env/lib/python3.11/runpy.py", "/home/u/tbmem/torch/train.py", "??",
    ...                       "/tmp/torchinductor_u/si/csip.py")]
    ['library', 'library', 'user', 'cpp', 'generated']
    >>> fc.kind_of("??", "torch::unwind::unwind()"), fc.kind_of("??", "at::native::mm")
    ('internal', 'cpp')
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
import sysconfig
from functools import lru_cache
from typing import Iterable, Sequence

__all__ = ["FrameClassifier", "LIBRARY_PACKAGES", "local_roots", "KINDS", "is_internal", "is_generated"]

#: Packages whose frames are machinery between the user's line and the allocation.
LIBRARY_PACKAGES = ("torch", "functorch", "tbmem", "phi", "phiml", "triton")
#: Frame kinds, in the order of their codes.
KINDS = ("user", "library", "cpp", "generated", "internal")
# the stack capture, the caching allocator, thread and process start, CPython's own C functions
_INTERNAL_NAMES = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "CUDACachingAllocator::",
                   "__libc_start_main", "__libc_start_call_main", "start_thread", "__clone")
_INTERNAL_FILES = ("pythonrun.c", "Modules/main.c", "Objects/call.c", "Objects/methodobject.c", "pycore_ceval.h",
                   "ceval.c", "cpython/abstract.h", "core/boxing/", "/Redispatch")
_CPYTHON_API = re.compile(r"^_?(Py[A-Z_]|PyEval|pymain_|cfunction_|method_vectorcall|slot_tp_|vectorcall)")
_GENERATED = re.compile(r"(^|/)torchinductor_[^/]*/|(^|/)torch_compile_debug/|^<eval_with_key>")
# a standard library's own top-level modules (a folder holding one of these is that library)
_STDLIB_NAMES = frozenset(getattr(sys, "stdlib_module_names", ())) or frozenset(
    ("abc", "ast", "asyncio", "collections", "concurrent", "contextlib", "copy", "functools", "importlib",
     "inspect", "json", "logging", "multiprocessing", "os", "pickle", "queue", "runpy", "threading", "typing"))
# the folder of an interpreter whose Lib holds its standard library: python3.11, Python311,
# cpython-3.10.19-windows-x86_64-none (uv), 3.10.4 (pyenv-win), anaconda3 (and conda's envs/<name>)
_INTERPRETER_DIR = re.compile(r"^(c?python[-_.]?\d[\w.+-]*|python|\d+\.\d+(\.\d+)?[\w.+-]*|"
                              r"(ana|mini)conda\d*|miniforge\d*|mambaforge)$", re.IGNORECASE)
_TORCH_MARKERS = ("nn/modules/module.py", "_tensor.py", "autograd/graph.py", "autograd/__init__.py",
                  "optim/optimizer.py", "_ops.py", "utils/_contextlib.py", "nn/functional.py")
_SITE_DIRS = ("site-packages", "dist-packages")


def _norm(path: str) -> str:
    p = path.replace("\\", "/")
    return p[:-1] if len(p) > 1 and p.endswith("/") else p


def _is_python(filename: str) -> bool:
    low = filename.lower()
    return low.endswith((".py", ".pyw")) or (filename.startswith("<") and filename.endswith(">")) \
        or filename.startswith("<eval_with_key>")


@lru_cache(maxsize=1)
def local_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(library package folders, standard library folders) of this interpreter (nothing imported)."""
    roots: list[str] = []
    stdlibs: list[str] = []
    for name in LIBRARY_PACKAGES:
        module = sys.modules.get(name)
        locations = list(getattr(module, "__path__", None) or [])
        if module is None:
            # PathFinder looks along sys.path only: no import, and no meta-path hook (an import
            # blocker, an editable-install finder) is asked about packages this process never used
            try:
                spec = importlib.machinery.PathFinder.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for loc in locations:
            roots.append(os.path.realpath(loc))
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            stdlibs.append(os.path.realpath(path))
    return tuple(sorted({_norm(r) for r in roots})), tuple(sorted({_norm(r) for r in stdlibs}))


def _site_roots() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib")}
    try:
        import site

        paths.update(site.getsitepackages())
        paths.add(site.getusersitepackages())
    except (AttributeError, ImportError):  # pragma: no cover - embedded interpreters
        pass
    return tuple(sorted({_norm(os.path.realpath(p)) for p in paths if p}))


class FrameClassifier:
    """Classifies frames as ``user``, ``library`` or ``cpp`` from package locations.

    Args:
        roots: Folders whose Python files are library frames (absolute, any separator).
        site_packages_are_library: Treat every file under a ``site-packages`` folder as
            library (by default third-party packages such as einops or transformers count as
            the user's code, so the line in them that allocated is shown).
    """

    def __init__(self, roots: Iterable[str] = (), *, stdlibs: Iterable[str] = (),
                 site_packages_are_library: bool = False) -> None:
        self.roots = tuple(sorted({_norm(r) for r in roots if r}, key=len, reverse=True))
        # a standard library inferred from a path: its files, but not those of its site-packages
        self.stdlibs = tuple(sorted({_norm(s) for s in stdlibs if s}))
        self.site = site_packages_are_library
        self._cache: dict[str, str] = {}

    @classmethod
    def for_paths(cls, filenames: Iterable[str], *, extra_roots: Sequence[str] = (),
                  extra_stdlibs: Sequence[str] = (), site_packages_are_library: bool = False,
                  local: bool = True) -> "FrameClassifier":
        """A classifier for a snapshot's file names: local roots, ``extra_roots`` (a recording's
        own), and the installations the paths themselves show."""
        roots = set(extra_roots)
        stdlibs: set[str] = set(extra_stdlibs)
        if local:
            packages, local_stdlibs = local_roots()
            roots.update(packages)
            stdlibs.update(local_stdlibs)
            if site_packages_are_library:
                roots.update(_site_roots())
        for name in set(filenames):
            inferred, stdlib = _inferred_roots(_norm(name), site_packages_are_library)
            roots.update(inferred)
            stdlibs.update(stdlib)
        return cls(roots, stdlibs=stdlibs, site_packages_are_library=site_packages_are_library)

    def kind_of(self, filename: str, name: str) -> str:
        """:meth:`kind`, with C++ frames of the stack capture, allocator and interpreter ``internal``."""
        kind = self.kind(filename)
        return "internal" if kind == "cpp" and is_internal(filename, name) else kind

    def kind(self, filename: str) -> str:
        """``user``, ``library``, ``generated`` or ``cpp`` (by file name alone)."""
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._cache[filename] = self._kind(filename)
        return hit

    def _kind(self, filename: str) -> str:
        if not _is_python(filename):
            return "cpp"
        path = _norm(filename)
        if _GENERATED.search(path):
            return "generated"
        if filename.startswith("<frozen"):
            return "library"
        if filename.startswith("<"):
            return "user"  # <string>, <stdin>, notebook cells
        for root in self.roots:
            if path == root or path.startswith(root + "/"):
                return "library"
        if self.site and any(f"/{d}/" in path for d in _SITE_DIRS):
            return "library"
        for root in self.stdlibs:
            if path.startswith(root + "/") and path[len(root) + 1:].split("/", 1)[0].lower() not in _SITE_DIRS:
                return "library"
        return "user"


def is_internal(filename: str, name: str) -> bool:
    """Whether a C++ frame belongs to the stack capture, the caching allocator, thread or process
    start, or the CPython interpreter (what memory_viz hides, and more)."""
    return (any(k in name for k in _INTERNAL_NAMES) or name == "_start" or bool(_CPYTHON_API.match(name))
            or any(k in filename for k in _INTERNAL_FILES))


def is_generated(filename: str) -> bool:
    """Whether a Python file is generated code (torch.compile's output, FX's ``<eval_with_key>``)."""
    return bool(_GENERATED.search(_norm(filename)))


def _inferred_roots(path: str, site_all: bool) -> tuple[list[str], list[str]]:
    """(package folders, standard library folders) a single path shows (see the module docstring)."""
    out: list[str] = []
    stdlibs: list[str] = []
    parts = path.split("/")
    low = [p.lower() for p in parts]
    for i, part in enumerate(low[:-1]):
        if part in _SITE_DIRS:
            pkg = parts[i + 1]
            name = pkg[:-3] if pkg.endswith(".py") else pkg
            if name.lower() in LIBRARY_PACKAGES or (site_all and i + 2 < len(parts)):
                out.append("/".join(parts[:i + 2]))
            # the interpreter's standard library: the folder holding site-packages (lib/python3.X)
            stdlib = "/".join(parts[:i])
            if stdlib and i > 0 and (low[i - 1].startswith("python") or low[i - 1] == "lib"):
                stdlibs.append(stdlib)
        # lib/python3.X/<stdlib module>, or <interpreter>/Lib/<stdlib module> (Windows, uv, pyenv-win)
        if part in ("lib", "lib64") and i + 1 < len(parts) - 1 and re.match(r"python\d", low[i + 1]):
            top = low[i + 2].removesuffix(".py") if i + 2 < len(parts) else ""
            if top in _STDLIB_NAMES:
                stdlibs.append("/".join(parts[:i + 2]))
        if part == "lib" and i > 0 and (_INTERPRETER_DIR.match(parts[i - 1]) or (i > 1 and low[i - 2] == "envs")):
            top = low[i + 1].removesuffix(".py")
            if top in _STDLIB_NAMES and (i + 2 < len(parts) or low[i + 1].endswith(".py")):
                stdlibs.append("/".join(parts[:i + 1]))
    for i, part in enumerate(low[:-1]):
        if part == "torch":
            rest = "/".join(parts[i + 1:])
            if rest in _TORCH_MARKERS:
                out.append("/".join(parts[:i + 1]))
    return out, stdlibs
