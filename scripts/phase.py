"""One phase of the Makefile's install: say what it does and how long it usually takes, run it, and
keep saying that it is going while the command itself is quiet.

pip prints nothing while it unpacks the wheels it has collected ("Installing collected packages: ...",
then silence: torch alone is 15,000 files); without a line every ``--every`` seconds a first install
looks hung. Standard library only: the first phase runs before ``.venv`` exists.

Usage (from the Makefile)::

    python3 scripts/phase.py "1/4" "creating .venv" 5 -- python3 -m venv .venv

prints ``== 1/4 creating .venv (usually about 5 s)``, runs the command with its output passed
through as it comes, ``   ... still creating .venv: 20 s so far`` after each ``--every`` seconds
of silence, and ``   done in 4.2 s``. The command's exit status is the script's.

Example:
    >>> import subprocess, sys
    >>> out = subprocess.run([sys.executable, __file__, "1/1", "saying hi", "1", "--", "echo", "hi"],
    ...                      capture_output=True, text=True).stdout
    >>> out.splitlines()[:2]
    ['== 1/1 saying hi (usually about 1 s)', 'hi']
"""

from __future__ import annotations

import argparse
import os
import selectors
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Run one phase; return the command's exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("number", help="the phase's number, e.g. 2/4")
    parser.add_argument("what", help="what the phase does, e.g. 'installing torch'")
    parser.add_argument("usual_s", type=float, help="how long it usually takes, in seconds")
    parser.add_argument("--every", type=float, default=20.0, help="seconds of silence between 'still' lines")
    parser.add_argument("--quiet-note", default="", help="said with the 'still' lines: why the command is quiet")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1:]
    if not command:
        parser.error("no command after --")
    out = sys.stdout.buffer
    out.write(f"== {args.number} {args.what} (usually about {args.usual_s:g} s)\n".encode())
    out.flush()
    start = time.monotonic()
    # unbuffered: a Python command (pip) writing into a pipe would otherwise hold its lines back
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    last = start
    at_line_start = True
    while True:
        if not selector.select(timeout=max(0.1, last + args.every - time.monotonic())):
            now = time.monotonic()
            note = f" ({args.quiet_note})" if args.quiet_note else ""
            out.write(f"{'' if at_line_start else chr(10)}   ... still {args.what}{note}: "
                      f"{now - start:.0f} s so far\n".encode())
            out.flush()
            last, at_line_start = now, True
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out.write(chunk)  # as it comes: pip's progress bars redraw with \r
        out.flush()
        last, at_line_start = time.monotonic(), chunk.endswith(b"\n")
    # wait4: the command's own CPU time (its waited-for children included), which says how long the phase
    # takes on a machine where it has the cores to itself, whatever else runs beside it now
    _, status, usage = os.wait4(proc.pid, 0)
    rc = proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - start
    out.write(f"{'' if at_line_start else chr(10)}   {'done' if rc == 0 else f'FAILED (exit {rc})'} "
              f"in {seconds:.1f} s (CPU {usage.ru_utime + usage.ru_stime:.1f} s)\n".encode())
    out.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
