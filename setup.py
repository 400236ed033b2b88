"""The C extensions (everything else is in pyproject.toml).

Both are optional: where they cannot be compiled (no C compiler), the install goes on and tbmem
uses their Python twins. The census's heap pass (tbmem/census/_gcwalk.c; without it the census
lists the heap with gc.get_objects(), ``tbmem.census.heap.C_HEAP_PASS`` is then False) and the
snapshot pickle reader's scan (tbmem/snapshot/_pickle_scan.c; without it numpy's,
``tbmem.snapshot.pickle_fast.C_SCAN`` is then False).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tbmem.census._gcwalk", ["tbmem/census/_gcwalk.c"], optional=True),
                   Extension("tbmem.snapshot._pickle_scan",
                             ["tbmem/snapshot/_pickle_scan.c", "tbmem/snapshot/_pickle_run.c"],
                             depends=["tbmem/snapshot/_pickle_parse.h"], optional=True)])
