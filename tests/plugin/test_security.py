"""No request reads outside the logdir, and a planted pickle never runs."""

from __future__ import annotations

import hashlib
import http.client
import urllib.parse

import pytest

from tests.plugin._logdir import SECRET_FRAME, get, get_json

ROUTES = ("overview", "at", "snapshots", "snapshot", "findings")


def _raw_get(server, path: str) -> tuple[int, bytes]:
    """A GET with the path sent byte for byte (no client-side normalisation of ../)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _no_secret(body: bytes, logdir_paths) -> None:
    secret_pickle = (logdir_paths["outside"] / "secret.pickle").read_bytes()
    assert b"TOP-SECRET-CONTENT" not in body
    assert secret_pickle[:64] not in body
    assert SECRET_FRAME.encode() not in body  # the secret pickle rendered


def test_traversal_in_run_names_is_refused(server, plugin_url, logdir_paths):
    outside = str(logdir_paths["outside"])
    attempts = ["../outside", "..%2Foutside", "%2e%2e%2foutside", "%2e%2e/%2e%2e/outside", outside,
                urllib.parse.quote(outside, safe=""), "train/../../outside", "train/../exp/rank0", "/etc",
                "train/linked_dir", "train%00", ""]
    for run in attempts:
        for route in ROUTES:
            path = f"/data/plugin/tbmem/{route}?run={run}&step=1&id=x"
            status, body = _raw_get(server, path)
            assert status in (400, 404), (path, status, body[:200])
            _no_secret(body, logdir_paths)


def test_snapshot_ids_cannot_name_paths(server, logdir_paths):
    secret = str(logdir_paths["outside"] / "secret.pickle")
    guesses = ["../outside/secret.pickle", "..%2F..%2Foutside%2Fsecret.pickle", urllib.parse.quote(secret, safe=""),
               "linked_secret.pickle", "memory_snapshot/iteration_20/rank0_memory_snapshot.pickle",
               # the ids the listing would give the symlinks, were they listed: still refused
               hashlib.sha256(b"linked_secret.pickle").hexdigest()[:16],
               hashlib.sha256(b"linked_dir/secret.pickle").hexdigest()[:16]]
    for sid in guesses:
        status, body = _raw_get(server, f"/data/plugin/tbmem/snapshot?run=train&id={sid}")
        assert status == 404, (sid, status)
        _no_secret(body, logdir_paths)


def test_raw_paths_outside_the_routes_are_refused(server, logdir_paths):
    for path in ["/data/plugin/tbmem/../../../etc/passwd", "/data/plugin/tbmem/static/..%2f..%2fplugin.py",
                 "/data/plugin/tbmem/static/%2e%2e/%2e%2e/plugin.py", "/data/plugin/tbmem/static/vendor/uplot/LICENSE",
                 "/data/plugin/tbmem/%2e%2e%2f%2e%2e%2f%2e%2e%2foutside/secret.txt",
                 "/data/plugin/tbmem/static/" + urllib.parse.quote(str(logdir_paths["outside"] / "secret.txt"))]:
        status, body = _raw_get(server, path)
        assert status in (400, 404), (path, status)
        assert b"import" not in body  # no Python source either
        _no_secret(body, logdir_paths)


def test_planted_pickle_is_listed_but_never_runs(server, plugin_url, logdir_paths):
    marker = logdir_paths["marker"]
    snaps = get_json(f"{plugin_url}/snapshots?run=train")
    evil = next(s for s in snaps if s["name"] == "evil_step5.pickle")
    for _ in range(2):
        status, body, headers = get(f"{plugin_url}/snapshot?run=train&id={evil['id']}")
        assert status == 422
        assert headers["Content-Type"].startswith("application/json")
        assert b"names Python objects" in body
    get_json(f"{plugin_url}/overview?run=train")
    get_json(f"{plugin_url}/findings?run=train")
    assert not marker.exists()
    assert not (logdir_paths["logdir"] / "train" / marker.name).exists()


@pytest.mark.parametrize("run", ["train", "exp/rank0"])
def test_no_response_carries_the_secret(plugin_url, logdir_paths, run):
    for route in ("overview", "at", "snapshots", "findings"):
        status, body, _ = get(f"{plugin_url}/{route}?run={urllib.parse.quote(run)}&step=10")
        assert status == 200
        _no_secret(body, logdir_paths)
        assert str(logdir_paths["logdir"]).encode() not in body  # no absolute paths either
