"""The C extensions (everything else is in pyproject.toml).

They are the fast path, built into the wheels (``pip wheel .``, ``python -m build``). Both are
optional: where they cannot be compiled (no C compiler), the install goes on and tbmem uses one
Python fallback per job. The census's heap pass (tbmem/_internal/census/_gcwalk.c; without it the census
lists the heap with gc.get_objects(), ``tbmem._internal.census.heap.C_HEAP_PASS`` is then False) and the
snapshot reader's compiled parts (tbmem/_internal/snapshot/_creader.h: the runs of trace events of the
pickle reader, the pairing of allocator events; without them pickles are read by the restricted
Unpickler and paired with numpy, ``tbmem._internal.snapshot.pickle_crun.C_READER`` is then False).
"""

from setuptools import Extension, setup

_CREADER = ["tbmem/_internal/snapshot/_creader.c", "tbmem/_internal/snapshot/_pickle_run.c", "tbmem/_internal/snapshot/_pair.c"]
setup(ext_modules=[Extension("tbmem._internal.census._gcwalk", ["tbmem/_internal/census/_gcwalk.c"], optional=True),
                   Extension("tbmem._internal.snapshot._creader", _CREADER, depends=["tbmem/_internal/snapshot/_creader.h"],
                             optional=True)])
