"""Every docstring example in the tbmem package runs."""

import doctest
import importlib
import pkgutil

import pytest

import tbmem


def _modules() -> list[str]:
    names = ["tbmem"]
    for info in pkgutil.walk_packages(tbmem.__path__, prefix="tbmem."):
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


@pytest.mark.parametrize("name", _modules())
def test_module_declares_all(name):
    module = importlib.import_module(name)
    if name.endswith("__main__"):
        pytest.skip("entry point")
    assert hasattr(module, "__all__"), f"{name} has no __all__"
