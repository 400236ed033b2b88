"""What a new user reads and runs first agrees with itself: the install shows progress, the README's
numbers are docs/benchmarks.md's, and it says what the tests need from outside the clone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _benchmark_facts() -> dict[str, str]:
    """benchmark or fact -> its number in bold, from the table at the top of docs/benchmarks.md."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    table = text.split("## Current numbers")[1].split("\n## ")[0]
    rows = [r.split(" | ") for r in table.splitlines() if r.startswith("| ") and "**" in r.split(" | ")[1]]
    return {fact.strip("| `"): re.search(r"\*\*(.+?)\*\*", number)[1] for fact, number, *_ in rows}


def _recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text()
    return text.split(f"\n{target}:", 1)[1].split("\n\n")[0]


def test_the_install_shows_its_progress():
    """Each install phase runs under scripts/phase.py, which says what it does and how long it usually
    takes; pip is never quiet (--quiet once gave 142 s of silence, the quiet unpacking after it 4 minutes)."""
    text = (ROOT / "Makefile").read_text()
    (pip,) = re.findall(r"^PIP := (.*)$", text, re.MULTILINE)
    assert "pip install" in pip and not re.search(r"\s(-q|--quiet)\b", pip)
    for target, phases in (("$(DEMO_STAMP)", 4), ("$(STAMP)", 2)):
        steps = [line.strip() for line in _recipe(target).splitlines()[1:] if line.startswith("\t")]
        work = [s for s in steps if not s.startswith(("@echo", "touch"))]
        assert len(work) == phases and all(s.startswith(("@$(PHASE) ", "@$(PIP_PHASE) ")) for s in work), work
        assert all("$(PIP)" not in s or s.startswith("@$(PIP_PHASE) ") for s in work)  # pip's quiet parts named
        numbers = [re.match(r'@\$\((?:PIP_)?PHASE\) "(\d+)/(\d+)" "[^"]+" \d+ -- ', s).groups() for s in work]
        assert numbers == [(str(i), str(phases)) for i in range(1, phases + 1)]


def test_a_quiet_phase_says_it_is_still_going():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "phase.py"), "--every", "0.3", "2/4",
                          "installing torch", "45", "--", sys.executable, "-c", "import time; time.sleep(1.2)"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "== 2/4 installing torch (usually about 45 s)"
    assert len([line for line in out if line.startswith("   ... still installing torch")]) >= 2
    assert re.fullmatch(r"   done in \d+\.\d s \(CPU \d+\.\d s\)", out[-1])


def test_make_demo_installs_only_what_the_demo_runs():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    recipe = _recipe("$(DEMO_STAMP)")
    assert "-e '.[demo]'" in recipe and "[all" not in recipe and "dev]" not in recipe
    assert re.search(r"^demo: \$\(DEMO_STAMP\)$", (ROOT / "Makefile").read_text(), re.MULTILINE)

    def closure(name: str) -> set[str]:
        out = set()
        for req in extras[name]:
            inner = re.fullmatch(r"tbmem\[(.+)\]", req)
            out |= set().union(*(closure(e) for e in inner[1].split(","))) if inner else {re.split(r"[<>=\[ ]", req)[0]}
        return out

    demo = closure("demo")
    assert {"hydra-core", "phiflow", "tqdm"} <= demo
    assert not demo & {"pytest", "playwright", "moto[server]", "moto", "wandb", "mlflow-skinny", "jupyterlab"}
    assert {"pytest", "playwright"} <= closure("dev")  # make test's install has them: `.[all,dev]`
    assert "-e '.[all,dev]'" in _recipe("$(STAMP)") and "$(DEMO_STAMP)" in _recipe("$(STAMP)").split("\n")[0]
    # the demo's closing `make report` reads runs with pandas, which the demo's install leaves out: the target
    # adds the analysis extra first (a fresh clone's `make demo && make report` said "'pandas' is not installed")
    assert "pandas" not in demo and "pandas" in closure("analysis")
    assert re.search(r"^report: \$\(REPORT_STAMP\)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert "-e '.[analysis]'" in _recipe("$(REPORT_STAMP)") and "$(DEMO_STAMP)" in _recipe("$(REPORT_STAMP)").split("\n")[0]


def test_the_readme_quotes_the_install_record():
    """The README's first-install figures are benchmarks/install.json's (benchmarks/bench_install.py)."""
    import json

    record = json.loads((ROOT / "benchmarks" / "install.json").read_text())
    readme = (ROOT / "README.md").read_text()
    demo, full = record["demo"], record["test_install"]
    para = readme.split("The first `make demo` on a fresh clone", 1)[1].split("\n\n", 1)[0]
    assert f"(benchmarks/install.json, {record['date']}" in para
    assert f"took {demo['wall_s']:.0f} s" in para and f"{demo['cpu_s']:.0f} s of CPU" in para
    assert f"leaves {demo['total_bytes'] / 1e9:.2f} GB" in para and f"`.venv` {demo['venv_bytes'] / 1e9:.2f} GB" in para
    assert f"load average {record['load_at_start']:g}" in para
    assert f"{full['wall_s']:.0f} s" in para and f"{full['cpu_s']:.0f} s of CPU" in para
    assert f"{full['added_bytes'] / 1e9:.2f} GB more" in para
    # and the Makefile's announced figures are the record's, rounded
    line = re.search(r"4 install phases, then the two trainings \(about (\d+) s of CPU and ([\d.]+) GB",
                     (ROOT / "Makefile").read_text())
    assert line and abs(int(line[1]) - demo["cpu_s"]) <= 10 and abs(float(line[2]) - demo["total_bytes"] / 1e9) <= 0.05


def test_the_readme_quotes_the_benchmarks_numbers():
    facts = _benchmark_facts()
    readme = (ROOT / "README.md").read_text()
    defaults, census = facts["trainer.epoch_defaults_vs_off"], facts["trainer.epoch_census_50_vs_off"]
    # every overhead claim of the README is one of these, with the date they were measured
    claims = re.findall(r"([+-]\d+(?:\.\d+)?%) (?:with tbmem's defaults|at the defaults|with a census)", readme)
    assert claims and set(claims) == {defaults.split()[0], census.split()[0]}
    assert "2026-11-24" in readme.split("Near-zero overhead")[1][:300]
    demo = facts["demo: a later `make demo` (`.venv` and the simulations kept)"]
    assert f"Later demos reuse them and take about {demo}" in readme
    trainers = (ROOT / "docs" / "trainers.md").read_text()
    quick = facts["demo: `burgers_quick_test trainer=synthetic_with_memory`, wall"]
    assert f"# ~{quick} on 2 CPU cores" in trainers and f"`burgers_quick_test trainer=synthetic_with_memory`: {quick} wall" in trainers


def test_the_readme_says_what_the_tests_need_from_outside_the_clone():
    readme = (ROOT / "README.md").read_text()
    assert "apt-get install chromium" in readme and "../shared/" in readme
    for test in ("tests/plugin/test_browser.py", "tests/snapshot/test_viewer.py"):
        assert test in readme and (ROOT / test).exists()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "export TBMEM_REQUIRE_SHARED=1" in ci and "export TBMEM_REQUIRE_BROWSER=1" in ci


def test_what_is_said_about_smoothing_is_true_for_each_tab():
    """``?smoothing=0`` reaches Time Series only (the Scalars tab stays at 0.6): wherever the README, the
    demo's closing lines and the note under the Memory tab's charts give it, they say so, and give the
    Scalars tab's slider; the demo prints the Memory tab's own address."""
    makefile = (ROOT / "Makefile").read_text()
    demo = "\n".join(re.findall(r'^\t@echo "(.*)"$', makefile.split("\ndemo: $(DEMO_STAMP)", 1)[1].split("\n\n")[0],
                                re.MULTILINE))
    note = re.search(r"id: 'smoothing-note', text: ((?:'[^']*'\s*\+?\s*)+)",
                     (ROOT / "tbmem/_internal/plugin/static/index.js").read_text().replace("\\'", "’"))
    assert note
    note_text = "".join(re.findall(r"'([^']*)'", note[1]))
    readme = (ROOT / "README.md").read_text()
    for name, text in (("README", readme), ("make demo", demo), ("the note", note_text)):
        for at in [m.start() for m in re.finditer(r"\?smoothing=0", text)]:
            around = text[max(0, at - 200):at + 200]
            assert "Time Series" in around, (name, around)
        assert re.search(r"Time Series only", text), name
        assert re.search(r"Scalars[^.]{0,40}\*?Smoothing\*? slider", text), name
    assert "http://127.0.0.1:6006/#tbmem" in demo and "http://127.0.0.1:6006/#tbmem" in readme
