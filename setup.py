"""The C extensions (everything else is in pyproject.toml).

They are the fast path, built into the wheels (``pip wheel .``, ``python -m build``). Both are
optional: where they cannot be compiled (no C compiler), the install goes on and tbmem uses one
Python fallback per job. The census's heap pass (tbmem/census/_gcwalk.c; without it the census
lists the heap with gc.get_objects(), ``tbmem.census.heap.C_HEAP_PASS`` is then False) and the
snapshot reader's compiled parts (tbmem/snapshot/_creader.h: the runs of trace events of the
pickle reader, the pairing of allocator events; without them pickles are read by the restricted
Unpickler and paired with numpy, ``tbmem.snapshot.pickle_crun.C_READER`` is then False).
"""

from setuptools import Extension, setup

_CREADER = ["tbmem/snapshot/_creader.c", "tbmem/snapshot/_pickle_run.c", "tbmem/snapshot/_pair.c"]
setup(ext_modules=[Extension("tbmem.census._gcwalk", ["tbmem/census/_gcwalk.c"], optional=True),
                   Extension("tbmem.snapshot._creader", _CREADER, depends=["tbmem/snapshot/_creader.h"],
                             optional=True)])
