"""``tbmem report LOGDIR``: the per-run summary, leak findings, loss spikes, hints, a figure, a CI gate.

Exit status: 0 fine; 1 a leak was found and ``--fail-on-leak`` was given;
2 the logdir cannot be analysed (missing, no event files, no tbmem tags,
damaged event files, a missing extra) or the figure cannot be written. Errors are one
line on stderr, never a traceback. Run names (folder names anyone with write access to a
shared logdir chooses) are printed and drawn with their control characters escaped
(:mod:`tbmem._internal._terminal`); ``--json`` keeps them exact.

Example:
    >>> from tbmem._internal.cli import main
    >>> main(["report", "/nonexistent/logdir"])
    2
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import math
import os
import sys
from typing import Any

from tbmem._internal._extras import MissingExtraError
from tbmem._internal._terminal import printable, printable_lines

__all__ = ["add_parser", "report_command", "EXIT_LEAK", "EXIT_ERROR"]

EXIT_LEAK = 1
EXIT_ERROR = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``report`` on the ``tbmem`` command line's subparsers."""
    from tbmem._internal.analysis.leaks import DEFAULT_NOISY_THRESHOLD_MB_PER_1K, DEFAULT_THRESHOLD_MB_PER_1K

    p = subparsers.add_parser(
        "report", help="summarize a logdir: peaks, category mix, step times, leaks",
        description="Summarize every run under LOGDIR: peak VRAM/RAM, the census category mix at its "
                    "peak, fragmentation, step times and leak findings. Exit status: 0 ok, "
                    f"{EXIT_LEAK} leak found with --fail-on-leak, {EXIT_ERROR} cannot analyse.")
    p.add_argument("logdir", metavar="LOGDIR", help="TensorBoard logdir (a run or a folder of runs)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--png", metavar="FILE", help="write a figure: memory timeline, categories stacked, "
                                                 "one panel per run (per job for rank folders)")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="only these two runs, side by side with their difference")
    p.add_argument("--fail-on-leak", action="store_true", help=f"exit {EXIT_LEAK} when a leak is found")
    p.add_argument("--threshold-mb-per-1k", type=float, default=DEFAULT_THRESHOLD_MB_PER_1K,
                   metavar="MB", help="leak threshold for exact tensor bytes (census, VRAM allocated), "
                                      "MB per 1000 steps (default %(default)s)")
    p.add_argument("--noisy-threshold-mb-per-1k", type=float, default=DEFAULT_NOISY_THRESHOLD_MB_PER_1K,
                   metavar="MB", help="leak threshold for RSS/USS/reserved/NVML memory (default %(default)s)")
    p.add_argument("--skip-fraction", type=float, default=0.25, metavar="F",
                   help="warm-up to ignore, as a fraction of the step range (default %(default)s)")
    p.add_argument("--wide", action="store_true",
                   help="one table, however wide (default: fit the terminal, COLUMNS or its width: long run "
                        "names break after '/', and runs come a few at a time)")
    p.add_argument("--all-ranks", action="store_true",
                   help="list every rank of a multi-rank job (default: all up to 20, else the extremes)")
    p.add_argument("--allow-truncated", action="store_true",
                   help="analyse the readable part of truncated or corrupt event files instead of stopping")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="the batch size the runs used, for the headroom hint (default: from a logged forecast "
                        "or the trainers' config)")
    p.set_defaults(func=report_command)
    return p


def _fail(message: str) -> int:
    print(f"tbmem report: {printable(message)}", file=sys.stderr)
    return EXIT_ERROR


def report_command(args: argparse.Namespace) -> int:
    """Run ``tbmem report``; returns the exit status."""
    from tbmem._internal.analysis.load import AnalysisError

    try:
        return _report(args)
    except (AnalysisError, MissingExtraError) as exc:
        return _fail(str(exc))
    except ValueError as exc:  # a bad option value (threshold <= 0, ...)
        return _fail(f"invalid option: {exc}")
    except BrokenPipeError:
        raise  # the reader of stdout went away: tbmem._internal.cli ends quietly
    except OSError as exc:  # unreadable files
        return _fail(_os_error(exc))


def _finite(obj: Any) -> Any:
    """NaN/inf (a diverged loss) become null: strict JSON parsers reject NaN."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _report(args: argparse.Namespace) -> int:
    from tbmem._internal.logdir.fs import fetched, is_url

    runs = list(args.compare) if args.compare else None
    on_error = "warn" if args.allow_truncated else "raise"
    logdir = args.logdir
    if is_url(logdir):  # s3://, gs://: copied into a temporary folder for the report, removed after it
        with fetched(logdir) as local:
            return _report_on(args, local, runs, on_error)
    return _report_on(args, logdir, runs, on_error)


def _report_on(args: argparse.Namespace, logdir: str, runs: list[str] | None, on_error: str) -> int:
    import dataclasses

    from tbmem._internal.analysis.hints import find_hints, format_hints
    from tbmem._internal.analysis.load import load_scalars_and_texts, run_loss_tags
    from tbmem._internal.analysis.ranks import format_rank_jobs, rank_jobs
    from tbmem._internal.analysis.spikes import find_spikes, format_spikes
    from tbmem._internal.analysis.summary import summarize
    from tbmem._internal.analysis.table import format_leaks, format_table
    from tbmem._internal.logdir.fs import is_url

    df, texts = load_scalars_and_texts(logdir, runs=runs, on_error=on_error)
    losses = run_loss_tags(logdir, sorted(df["run"].unique()))  # each run's own loss tags (its settings)
    if not args.json:  # a run's name is printed (and drawn) with its control characters escaped
        df, texts = _printable_runs(df), _printable_runs(texts)
        runs = [printable(r) for r in runs] if runs else runs
        losses = {printable(r): p for r, p in losses.items()}
    summaries = summarize(df, runs=runs, loss_tags=losses, threshold_mb_per_1k=args.threshold_mb_per_1k,
                          noisy_threshold_mb_per_1k=args.noisy_threshold_mb_per_1k,
                          skip_fraction=args.skip_fraction)
    hints = find_hints(df, texts=texts, summaries=summaries,
                       batch_size=getattr(args, "batch_size", None))
    summaries = [dataclasses.replace(s, hints=[h for h in hints if h.run == s.run]) for s in summaries]
    if not args.compare:  # compact jobs: every rank from the Parquet rank tables (columnar queries)
        from tbmem._internal.analysis.rank_table import compact_jobs, with_table_ranks

        tables = compact_jobs(logdir)
        if tables:
            summaries = with_table_ranks(logdir, summaries, jobs=tables)
    spikes = find_spikes(df, logdir, runs=[s.run for s in summaries])
    jobs = [] if args.compare else rank_jobs(summaries)
    in_jobs = {run for j in jobs for run in j.runs.values()}
    others = [s for s in summaries if s.run not in in_jobs]
    # the job of rank folders right in the logdir ("."): named after the logdir's folder
    root = os.path.basename(os.path.abspath(args.logdir).rstrip("/\\")) if not is_url(args.logdir) \
        else args.logdir.rstrip("/").rsplit("/", 1)[-1]
    if args.json:
        doc = {"logdir": args.logdir, "runs": [s.to_dict() for s in summaries],
               "jobs": [j.to_dict() for j in jobs], "spikes": [f.to_dict() for f in spikes]}
        print(json.dumps(_finite(doc), indent=2, allow_nan=False))
    else:
        # rank folders get one row per rank (1,000 ranks do not fit as columns); other runs a column each
        if others:
            width = None if getattr(args, "wide", False) else _terminal_width()
            print(printable_lines(format_table(others, compare=bool(args.compare), width=width)))
            print()
        if jobs:
            print(printable_lines(format_rank_jobs(jobs, summaries, all_ranks=args.all_ranks, root=printable(root))))
            print()
        print(printable_lines(format_leaks(summaries)))
        print()
        print(printable_lines(format_spikes(spikes)))
        print()
        print(printable_lines(format_hints(hints)))
    if args.png:
        # after the table: a figure that cannot be written does not take the summary with it
        from tbmem._internal.analysis.plot import plot_timeline

        sys.stdout.flush()
        try:
            fig = plot_timeline(_printable_runs(df) if args.json else df,
                                runs=[printable(s.run) for s in others], jobs=jobs, root=printable(root))
            _save_figure(fig, args.png)
        except BrokenPipeError:
            raise
        except OSError as exc:
            return _fail(f"cannot write the figure: {_os_error(exc, args.png)}")
        except ValueError as exc:  # a suffix matplotlib has no format for
            return _fail(f"cannot write the figure: {exc}")
        if not args.json:
            print(f"\nfigure written to {printable(args.png)}")
    leaked = any(s.has_leak for s in summaries)
    return EXIT_LEAK if (leaked and args.fail_on_leak) else 0


def _terminal_width() -> int | None:
    """The columns to fit: ``COLUMNS`` when set, else the terminal's when stdout is one; None (no limit)
    when the output goes to a file or a pipe."""
    import shutil

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _printable_runs(df: Any) -> Any:
    """``df`` with its ``run`` column made printable (the names are equal where nothing is escaped)."""
    if "run" not in df.columns or not len(df):
        return df
    return df.assign(run=df["run"].map(printable))


def _save_figure(fig: Any, path: str) -> None:
    """Write ``fig`` to exactly ``path`` (format from its suffix, PNG without one), checking every write.

    Rendered in memory first: matplotlib writing to a path appends ``.png`` to a name without a
    suffix (the line said another file was written) and lets a failed write pass (``/dev/full``).
    """
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    supported = fig.canvas.get_supported_filetypes()
    if fmt not in supported:
        raise ValueError(f"{path}: no figure format for .{fmt} (use one of .{', .'.join(sorted(supported))})")
    data = io.BytesIO()
    fig.savefig(data, format=fmt, dpi=110)
    with open(path, "wb") as fh:  # a failed write (or the flush at close) raises here
        fh.write(data.getbuffer())


def _os_error(exc: OSError, path: str | None = None) -> str:
    """``PATH: reason``, the way the shell's tools say it."""
    where = exc.filename or path
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}" if where else reason
