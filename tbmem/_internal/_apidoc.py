"""docs/api.md, generated from ``tbmem.__all__`` and the public modules: ``python -m tbmem._internal._apidoc``
rewrites it, ``python -m tbmem._internal._apidoc --check`` fails when it is not current (tests/test_public_api.py).

Each public name is listed with its signature and the first line of its docstring; the page's other text
(how to drive a step, the names deprecated) is written here, beside the code that lists the names.

Example:
    >>> from tbmem._internal._apidoc import signature_of
    >>> signature_of(signature_of)
    '(obj: Any) -> str'
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["render", "signature_of", "main", "moved_rows"]



def _root() -> Path:
    """The checkout this module is in (the folder with ``docs/`` beside ``tbmem/``), wherever below tbmem."""
    here = Path(__file__).resolve()
    return next((p for p in here.parents if (p / "docs").is_dir() and (p / "tbmem").is_dir()), here.parents[1])


PAGE = _root() / "docs" / "api.md"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

HEAD = """# The public API

Generated from `tbmem.__all__` and the public modules by `tbmem/_internal/_apidoc.py` (DEVELOPERS.md); do not
edit by hand (`tests/test_public_api.py` fails when this page and the code disagree).

The stable surface of tbmem is the names below: those of `tbmem` itself and of the public modules
`tbmem.console`, `tbmem.analysis`, `tbmem.forecast` and `tbmem.integrations` (with its modules). Every
other module lives in `tbmem._internal`: tbmem's own, it may change without notice; the bundled trainers
and the integrations use nothing else (a test reads their imports). The TensorBoard plugin's entry point and
the `tbmem` command (also `python -m tbmem`) are installed by pyproject.toml and are not imported by users.
"""

STEP = """## Driving a step

One way, in two forms:

- `with writer.monitored_step(step):` around each training step: it marks the step's start, records
  memory after the step (`log_memory`), and on an exception saves what it can (an out-of-memory error gets
  its snapshot and record) and lets the same exception object go on.
- Loops and frameworks with hooks of their own call the three parts that context manager is made of:
  `writer.begin_step(step)` when a step starts, `writer.log_memory(step, roots=..., where=...)` when it
  has done its work (mid-step, so the census sees the activations), and `writer.step_failed(step, exc)`
  where they catch an exception (then re-raise it). A loop that calls only `log_memory(step)` once per
  step gets the same records (without the out-of-memory snapshot).

`begin_step(step)` returns whether `log_memory(step)` has anything to do at that step: a loop that skips
the call where it is False (the bundled trainers) saves its cost inside the step. `step_failed(step, exc)`
is the one call for an exception: it handles an out-of-memory error and flushes after any other.
`write_scalars(values, step)` writes many scalars as one event (to TensorBoard and every sink), where
`add_scalar` writes one event per tag; the other `SummaryWriter` methods work unchanged.

Deprecated, each with a `DeprecationWarning` naming its replacement: `next_due(step)` (use what
`begin_step(step)` returns), `handle_oom(step, exc)` (use `step_failed(step, exc)`),
`write_readings(readings, step)` (use `write_scalars` with the tags' names and units of `tbmem.TAGS`).
"""

# move_internal_modules: keep (the names as they were: scripts/move_internal_modules.py leaves them)
DEPRECATED = """## Renamed, with the old form still accepted

| old | now | since |
|---|---|---|
| `EpochMemoryMonitor(enabled, verbose_batches, writer, file)` | `writer=`, `file=` by keyword | 0.2 (warns) |
| `EpochPerformanceMonitor(enabled, verbose_batches, device)` | `device=` by keyword, default None (was 0) | 0.2 (warns) |
| `PerformanceMonitor(enabled, device)` | `device=` by keyword, default None (was 0) | 0.2 (warns) |
| `track_performance(label, print_result, device)` | `print_result=`, `device=` by keyword | 0.2 (warns) |
| `monitor_performance(label, device)` | `device=` by keyword | 0.2 (warns) |
| `MemoryWriter.next_due(step)` | what `MemoryWriter.begin_step(step)` returns | 0.2 (warns) |
| `MemoryWriter.handle_oom(step, exc)` | `MemoryWriter.step_failed(step, exc)` | 0.2 (warns) |
| `MemoryWriter.write_readings(readings, step)` | `MemoryWriter.write_scalars` with `tbmem.TAGS`' tags and units | 0.2 (warns) |
"""

MOVED_HEAD = """## Moved in 0.2

Every module outside the names above moved to `tbmem._internal` (`tbmem/census/` is `tbmem/_internal/census/`),
and the old paths are gone: import what a row names instead. The modules the README and docs/ named before, and
where their public names are now:

| 0.1 | 0.2 |
|---|---|
"""

#: Commands and modules whose new home is not a list of names.
MOVED_BY_HAND = [
    ("`python -m tbmem.cli ...`", "`tbmem ...` (or `python -m tbmem ...`)"),
    ("`python -m tbmem.snapshot.native`", "`tbmem snapshot build-recorder`"),
    ("`tbmem.plugin` (the Memory tab)", "installed as TensorBoard's plugin by pyproject.toml; nothing to import"),
]
# move_internal_modules: end

RESERVED = {"tbmem.integrations": "the framework integrations (PyTorch Lightning, Hugging Face Trainer, "
                                  "Accelerate): reserved; issue 37 adds this module and its submodules"}


class _Raw:
    """Text that ``inspect.Signature`` prints as it is (annotations kept as strings by
    ``from __future__ import annotations``, defaults without their addresses)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature_of(obj: Any) -> str:
    """``obj``'s call signature as the page prints it (a class: its constructor's, without ``self``)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""

    def ann(a: Any) -> Any:
        if a is inspect.Parameter.empty:
            return a
        return _Raw(a if isinstance(a, str) else inspect.formatannotation(a))

    params = [p.replace(annotation=ann(p.annotation),
                        default=p.default if p.default is inspect.Parameter.empty
                        else _Raw(_ADDRESS.sub("", repr(p.default))))
              for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=ann(sig.return_annotation)))


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) if callable(obj) or inspect.ismodule(obj) else None
    return doc.strip().split("\n\n", 1)[0].replace("\n", " ") if doc else ""


def _entry(name: str, obj: Any) -> str:
    kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
    if kind == "value":
        text = _ADDRESS.sub("", repr(obj))
        shown = text if len(text) <= 60 else f"{type(obj).__name__}"
        return f"- `{name}` ({shown})"
    summary = _summary(obj)
    return f"- `{name}{signature_of(obj)}`" + (f": {summary}" if summary else "")


def _section(module: str) -> list[str]:
    if module in RESERVED and importlib.util.find_spec(module) is None:
        return [f"## `{module}`", "", RESERVED[module] + ".", ""]
    mod = importlib.import_module(module)
    names = [n for n in mod.__all__ if not n.startswith("__")]
    lines = [f"## `{module}`", ""]
    summary = _summary(mod)
    if summary:
        lines += [summary, ""]
    lines += [_entry(n, getattr(mod, n)) for n in sorted(names, key=str.lower)]
    return lines + [""]


def _homes() -> dict[int, list[str]]:
    """id(object) -> the public names it has (``tbmem.MemoryMonitor``, ``tbmem.console.MemoryMonitor``)."""
    import tbmem

    out: dict[int, list[str]] = {}
    for module in ("tbmem", *tbmem.PUBLIC_MODULES):
        if importlib.util.find_spec(module) is None:
            continue
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            if not name.startswith("__") and name != "PUBLIC_MODULES":
                out.setdefault(id(getattr(mod, name)), []).append(f"{module}.{name}")
    return out


def _old_home(module: str) -> str:
    """The 0.1 module a ``tbmem._internal`` module's names were documented under (``tbmem.snapshot`` for
    ``tbmem._internal.snapshot.readers``; a facade's submodules under the facade: ``tbmem.analysis.*``)."""
    parts = module.split(".")[2:]
    if parts and parts[0] in ("analysis", "forecast"):
        return f"tbmem.{parts[0]}.*"
    return "tbmem." + parts[0] if parts else "tbmem"


# move_internal_modules: keep (the example names a 0.1 module)
def moved_rows() -> list[tuple[str, str]]:
    """("0.1 module", "its public names now") for every module of tbmem._internal a public name comes from.

    Example:
        >>> dict(moved_rows())["`tbmem.census`"]
        '`tbmem.Census`, `tbmem.take_census`'
    """
    import tbmem

    exports: dict[str, str] = dict(getattr(tbmem, "_EXPORTS", {}))
    groups: dict[str, dict[int, list[str]]] = {}
    homes = _homes()
    for obj_id, names in homes.items():
        first = names[0]
        module, _, name = first.rpartition(".")
        obj = getattr(importlib.import_module(module), name)
        where = getattr(obj, "__module__", None) if inspect.isclass(obj) or inspect.isroutine(obj) else None
        where = where or exports.get(name, "").partition(":")[0]
        if where.startswith("tbmem._internal."):
            groups.setdefault(_old_home(where), {})[obj_id] = names
    rows = []
    for old in sorted(groups):
        if old.split(".")[1].startswith("_"):
            continue  # private in 0.1 already: never documented
        named = groups[old].values()
        shared = set.intersection(*({n.rpartition(".")[0] for n in names} for names in named)) - {"tbmem"}
        chosen = [next(n for n in names if n.rpartition(".")[0] == min(shared)) if shared
                  else min(names, key=lambda n: (n.count("."), n)) for names in named]
        if shared and len(chosen) > 8:  # a long list, all in one public module's section above
            rows.append((f"`{old}`", f"`{min(shared)}` (the names its section above lists)"))
            continue
        by_home: dict[str, list[str]] = {}
        for name in chosen:
            by_home.setdefault(name.rpartition(".")[0], []).append(name.rpartition(".")[2])
        cells = []
        for home in sorted(by_home, key=lambda h: (h != "tbmem", h)):
            names = sorted(by_home[home], key=str.lower)
            cells.append(", ".join(f"`tbmem.{n}`" for n in names) if home == "tbmem"
                         else f"`{home}`: " + ", ".join(f"`{n}`" for n in names))
        rows.append((f"`{old}`", "; ".join(cells)))
    return rows + MOVED_BY_HAND
# move_internal_modules: end


def render() -> str:
    """The text of docs/api.md for the code as it is."""
    import tbmem

    lines = [HEAD]
    for module in ("tbmem", *tbmem.PUBLIC_MODULES):
        lines += _section(module)
    moved = MOVED_HEAD + "".join(f"| {old} | {new} |\n" for old, new in moved_rows())
    return "\n".join(lines) + "\n" + STEP + "\n" + DEPRECATED + "\n" + moved


def main(argv: list[str] | None = None) -> int:
    """Write docs/api.md, or with ``--check`` say whether it is current (exit status 1 when not)."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in args:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE} is not current: run python -m tbmem._internal._apidoc", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
