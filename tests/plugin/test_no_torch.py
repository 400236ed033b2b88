"""TensorBoard with the plugin serves every route in a process where torch (and pandas) cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.plugin._logdir import Server, get, get_json

_BLOCKER = textwrap.dedent("""
    import sys

    BLOCKED = {blocked!r}
    LOG = {log!r}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                with open(LOG, "a") as fh:
                    fh.write(name + "\\n")
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocker())
    from tensorboard import default
    from tensorboard import main as tb_main

    # Other distributions' TensorBoard plugins (torch-tb-profiler, installed by the dev extra) need torch or
    # pandas themselves; a user without torch has none of them. TensorBoard's own plugins and tbmem's, found
    # through its real entry point, are loaded as usual.
    _all_entry_points = default._iter_entry_points

    def _tensorboard_and_tbmem_only(group):
        kept = [ep for ep in _all_entry_points(group) if ep.value.split(".")[0] in ("tensorboard", "tbmem")]
        assert [ep.name for ep in kept if ep.value.startswith("tbmem.")] == ["tbmem"], kept
        return kept

    default._iter_entry_points = _tensorboard_and_tbmem_only
    sys.argv = ["tensorboard", *sys.argv[1:]]
    sys.exit(tb_main.run_main())
""")


def _start(tmp: Path, logdir: Path, blocked: tuple[str, ...]) -> tuple[Server, Path]:
    """A real tensorboard whose process refuses to import ``blocked`` and logs every attempt."""
    attempts = tmp / "blocked-imports.txt"
    script = tmp / "tb_blocked.py"
    script.write_text(_BLOCKER.format(blocked=blocked, log=str(attempts)))
    srv = Server(tmp, "--logdir", str(logdir), "--load_fast", "false", command=[sys.executable, str(script)])
    return srv, attempts


def test_every_route_works_without_torch_and_pandas(logdir_paths, tmp_path):
    srv, attempts = _start(tmp_path, logdir_paths["logdir"], ("torch", "pandas"))
    try:
        assert get_json(f"{srv.base}/data/plugins_listing")["tbmem"]["enabled"] is True
        url = f"{srv.base}/data/plugin/tbmem"
        get_json(f"{url}/runs")
        overview = get_json(f"{url}/overview?run=train")
        assert overview["census_steps"] == [0, 10, 20]
        assert get_json(f"{url}/at?run=train&step=10")["census"]["top"]
        snaps = get_json(f"{url}/snapshots?run=train")
        for s in snaps:
            status, _, _ = get(f"{url}/snapshot?run=train&id={s['id']}")
            assert status == (422 if s["name"].startswith("evil") else 200)
        get_json(f"{url}/ranks?group=exp")
        assert get_json(f"{url}/profiles?run=train") == []
        leaky = get_json(f"{url}/findings?run=leaky")
        # leak findings need only numpy; the report's summary names the extra it needs
        assert any(f["tag"] == "Memory/Tensor_Category/other_MB" for f in leaky["leaks"])
        assert leaky["summary_text"] is None and "pip install 'tbmem[analysis]'" in leaky["summary_error"]
        # the compare view runs `tbmem compare`'s code, which needs pandas: it says so
        assert "pip install 'tbmem[analysis]'" in get_json(f"{url}/compare?run=train&run=leaky")["error"]
        for asset in ("index.js", "chart.js", "compare.js", "util.js", "profiles.js", "static/uPlot.iife.min.js",
                      "static/style.css",
                      "static/uPlot.min.css"):
            assert get(f"{url}/{asset}")[0] == 200
    finally:
        srv.stop()
    tried = attempts.read_text().split() if attempts.exists() else []
    assert not [m for m in tried if m.split(".")[0] == "torch"], tried
    assert "tbmem: the Memory tab could not be loaded" not in srv.log.read_text()


def test_importing_the_plugin_imports_no_torch():
    code = ("import sys, tbmem._internal.plugin.plugin, tbmem._internal.plugin.loader, tbmem._internal.plugin.findings;"
            "from tbmem._internal.plugin.loader import MemoryPluginLoader;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
