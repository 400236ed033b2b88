"""Which frame of a stack is the user's line: decided from where packages really are, not substrings.

A frame is C++ (no Python source file: ``??``, ``RegisterCUDA.cpp``), library Python
(inside an installed package tbmem treats as machinery: torch, functorch, tbmem, PhiFlow's
``phi``/``phiml``, the standard library, and every ``site-packages`` package when asked),
or user Python. The user frame of a stack is its innermost user Python frame; C++ frames
are never chosen.

Where the packages are is known three ways: from this interpreter (``importlib`` finds
torch, tbmem, ... without importing them; ``sysconfig`` names the standard library and
``site-packages``), from the roots a tbmem recording stored in its metadata, and, for
snapshots captured on other machines, from the file paths themselves: a path
``<prefix>/site-packages/torch/...`` is torch installed under ``<prefix>``, whose
``<prefix>/..`` (``lib/python3.X``) is that interpreter's standard library, and a
folder holding torch's own files (``nn/modules/module.py``, ``_tensor.py``) is a torch
checkout. A folder merely *named* ``tbmem`` or ``torch`` (a clone of this repository, a
user's script folder) is none of these, so user frames in it are found.

Example:
    >>> from tbmem.snapshot.frames import FrameClassifier
    >>> fc = FrameClassifier.for_paths(["/env/lib/python3.11/site-packages/torch/nn/modules/module.py"])
    >>> [fc.kind(p) for p in ("/env/lib/python3.11/site-packages/torch/_tensor.py",
    ...                       "/env/lib/python3.11/runpy.py", "/home/u/tbmem/torch/train.py", "??")]
    ['library', 'library', 'user', 'cpp']
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import sysconfig
from functools import lru_cache
from typing import Iterable, Sequence

__all__ = ["FrameClassifier", "LIBRARY_PACKAGES", "local_roots", "KINDS"]

#: Packages whose frames are machinery between the user's line and the allocation.
LIBRARY_PACKAGES = ("torch", "functorch", "tbmem", "phi", "phiml", "triton")
#: Frame kinds, in the order of their codes.
KINDS = ("user", "library", "cpp")
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
            packages, stdlib = _inferred_roots(_norm(name), site_packages_are_library)
            roots.update(packages)
            stdlibs.update(stdlib)
        return cls(roots, stdlibs=stdlibs, site_packages_are_library=site_packages_are_library)

    def kind(self, filename: str) -> str:
        """``user``, ``library`` or ``cpp``."""
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._cache[filename] = self._kind(filename)
        return hit

    def _kind(self, filename: str) -> str:
        if not _is_python(filename):
            return "cpp"
        if filename.startswith("<frozen") or filename.startswith("<eval_with_key>"):
            return "library"
        if filename.startswith("<"):
            return "user"  # <string>, <stdin>, notebook cells
        path = _norm(filename)
        for root in self.roots:
            if path == root or path.startswith(root + "/"):
                return "library"
        if self.site and any(f"/{d}/" in path for d in _SITE_DIRS):
            return "library"
        for root in self.stdlibs:
            if path.startswith(root + "/") and path[len(root) + 1:].split("/", 1)[0].lower() not in _SITE_DIRS:
                return "library"
        return "user"


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
    for i, part in enumerate(low[:-1]):
        if part == "torch":
            rest = "/".join(parts[i + 1:])
            if rest in _TORCH_MARKERS:
                out.append("/".join(parts[:i + 1]))
    return out, stdlibs
