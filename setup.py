"""The one C extension (everything else is in pyproject.toml).

The census's heap pass in C (tbmem/census/_gcwalk.c) is optional: where it cannot be compiled
(no C compiler), the install goes on and the census lists the heap with gc.get_objects()
(``tbmem.census.heap.C_HEAP_PASS`` is then False).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tbmem.census._gcwalk", ["tbmem/census/_gcwalk.c"], optional=True)])
