"""SIGTERM, as schedulers send it before a kill: real signals to a child process, records counted on disk."""

from __future__ import annotations

import signal

from tests.faults._child import finish, start_child, steps_of, tbmem_lines, wait_for_line

RSS = "Memory/RAM/process_rss_GB"

_LOOP = """
    import os, sys, time
    from tbmem import MemoryWriter
    w = MemoryWriter(os.path.join(sys.argv[1], "run"), every=5, census_every=0, custom_layout=False)
    for step in range(100000):
        w.add_scalar("Loss/train", 1.0 / (step + 1), step)
        w.log_memory(step)
        print("step", step, flush=True)
        time.sleep(0.02)
"""


def test_sigterm_flushes_writes_a_final_record_closes_then_dies_by_sigterm(tmp_path):
    proc = start_child(_LOOP, str(tmp_path))
    lines = wait_for_line(proc, lambda line: line == "step 12")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == -signal.SIGTERM  # the default behaviour went on: killed by the signal
    printed = [int(line.split()[1]) for line in lines + out.splitlines() if line.startswith("step ")]
    last = printed[-1]
    (line,) = tbmem_lines(err)
    final = int(line.split("final record at step ")[1].split()[0])
    assert final in (last, last + 1)  # the signal may land between log_memory and print
    assert line == f"tbmem: SIGTERM: final record at step {final} written, {tmp_path / 'run'} closed"
    # every due record up to the final step, then the final record itself
    assert steps_of(tmp_path / "run", RSS) == list(range(0, final + 1, 5)) + [final]
    assert steps_of(tmp_path / "run", "Loss/train") == list(range(final + 1))


def test_sigterm_leaves_a_handler_of_the_users_alone(tmp_path):
    proc = start_child("""
        import signal, sys
        def handler(signum, frame):
            print("the user's handler ran", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
    """ + _LOOP.replace("\n    ", "\n        "), str(tmp_path))
    wait_for_line(proc, lambda line: line == "step 7")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == 3 and "the user's handler ran" in out
    assert tbmem_lines(err) == []
    # sys.exit ran the at-exit flush: every due record is on disk
    assert steps_of(tmp_path / "run", RSS)[:2] == [0, 5]
