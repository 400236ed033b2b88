"""Which frame is the user's: from where packages are installed, never from folder names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tbmem._internal.snapshot.frames import FrameClassifier

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import torch
    from tbmem._internal.snapshot.recorder import DispatchRecorder
    from tbmem._internal.snapshot.schema import encode_json_gz

    def make_activations(x):
        return torch.nn.functional.dropout(x, p=0.5, training=True)   # the user's line; allocates in torch

    x = torch.ones(1 << 20)
    rec = DispatchRecorder()
    rec.start()
    y = make_activations(x)
    rec.stop()
    open("snap.json.gz", "wb").write(encode_json_gz(rec.snapshot(kind="snapshot", step=0)))
""")


FOLDERS = [("tbmem",), ("tbmem", "torch"), ("phi",), ("clone", "tbmem", "phiml")]
#: Runs each script given as a script (``__main__``, its own folder first on the path and the working directory),
#: one after the other in one process: one torch import for all of them.
_RUN_SCRIPTS = """
import os, runpy, sys
for script in sys.argv[1:]:
    folder = os.path.dirname(script)
    os.chdir(folder)
    sys.path.insert(0, folder)
    runpy.run_path(script, run_name="__main__")
    sys.path.remove(folder)
"""


@pytest.fixture(scope="module")
def user_scripts(tmp_path_factory):
    """``train.py`` (SCRIPT) in each folder of FOLDERS, run: each wrote its ``snap.json.gz`` beside it."""
    root = tmp_path_factory.mktemp("folders")
    scripts = {}
    for folders in FOLDERS:
        where = root.joinpath(*folders)
        where.mkdir(parents=True)
        scripts[folders] = where / "train.py"
        scripts[folders].write_text(SCRIPT)
    subprocess.run([sys.executable, "-c", _RUN_SCRIPTS, *map(str, scripts.values())], cwd=root,
                   env=dict(os.environ, PYTHONPATH=ROOT), check=True, capture_output=True, timeout=300)
    return scripts


@pytest.mark.parametrize("folders", FOLDERS)
def test_user_script_in_a_folder_named_like_a_library(user_scripts, folders):
    # a clone of this repository is a folder named tbmem: the old substring test ("/tbmem/") hid
    # every frame in it and named a torch frame instead
    script = user_scripts[folders]
    out = subprocess.run([sys.executable, "-m", "tbmem", "snapshot", "stats", str(script.parent / "snap.json.gz"),
                          "--json", "--top", "1"], env=dict(os.environ, PYTHONPATH=ROOT), check=True,
                         capture_output=True, text=True, timeout=300)
    top = json.loads(out.stdout)["devices"][0]["top_allocations"][0]
    assert top["bytes"] == 4 << 20
    # the innermost frame is torch's (nn/functional.py): the user's line is the one that called it
    assert top["frame"] == {"filename": str(script), "line": 7, "name": "make_activations"}


def test_foreign_paths_windows_and_checkouts():
    names = [r"D:\Dev\proj\.venv\Lib\site-packages\torch\nn\modules\module.py",
             "/opt/conda/lib/python3.10/site-packages/torch/_tensor.py",
             "/home/u/src/pytorch/torch/nn/modules/module.py"]
    fc = FrameClassifier.for_paths(names, local=False)
    assert fc.kind(r"D:\Dev\proj\.venv\Lib\site-packages\torch\optim\adam.py") == "library"
    assert fc.kind(r"D:\Dev\proj\.venv\Lib\site-packages\einops\_backends.py") == "user"
    assert fc.kind(r"D:\Dev\proj\.venv\Lib\runpy.py") == "library"  # that interpreter's standard library
    assert fc.kind("/opt/conda/lib/python3.10/threading.py") == "library"
    assert fc.kind("/home/u/src/pytorch/torch/autograd/graph.py") == "library"  # a torch checkout
    assert fc.kind("/home/u/tbmem/torch/train.py") == "user"
    assert fc.kind("<frozen importlib._bootstrap>") == "library" and fc.kind("<stdin>") == "user"
    assert fc.kind("RegisterCUDA.cpp") == "cpp" and fc.kind("??") == "cpp" and fc.kind("") == "cpp"
    strict = FrameClassifier.for_paths(names, local=False, site_packages_are_library=True)
    assert strict.kind(r"D:\Dev\proj\.venv\Lib\site-packages\einops\_backends.py") == "library"


def test_this_interpreters_packages_are_found_without_importing_them():
    code = ("import sys; from tbmem._internal.snapshot.frames import local_roots; p, s = local_roots(); "
            "print(any(r.endswith('/torch') for r in p), any(r.endswith('/tbmem') for r in p), bool(s), "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.stdout.split() == ["True", "True", "True", "False"]
