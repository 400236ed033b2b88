"""The C extensions (everything else is in pyproject.toml).

Both are optional: where they cannot be compiled (no C compiler), the install goes on and tbmem
uses their Python twins. The census's heap pass (tbmem/census/_gcwalk.c; without it the census
lists the heap with gc.get_objects(), ``tbmem.census.heap.C_HEAP_PASS`` is then False) and the
snapshot reader's compiled parts (tbmem/snapshot/_creader.h: the pickle parser and runs of trace
events, the pairing of allocator events; without them numpy's, ``tbmem.snapshot.pickle_crun.C_READER``
is then False).
"""

from setuptools import Extension, setup

_CREADER = ["tbmem/snapshot/_creader.c", "tbmem/snapshot/_pickle_scan.c", "tbmem/snapshot/_pickle_run.c",
            "tbmem/snapshot/_pair.c"]
setup(ext_modules=[Extension("tbmem.census._gcwalk", ["tbmem/census/_gcwalk.c"], optional=True),
                   Extension("tbmem.snapshot._creader", _CREADER, depends=["tbmem/snapshot/_creader.h"],
                             optional=True)])
