"""Every docstring example in the tbmem and trainers packages runs, and every module declares __all__."""

import doctest
import importlib
import pkgutil

import pytest

import tbmem
import trainers


def _modules() -> list[str]:
    names = ["tbmem", "trainers"]
    for package in (tbmem, trainers):
        names += [info.name for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")]
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
