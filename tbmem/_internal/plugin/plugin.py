"""The ``tbmem`` TensorBoard plugin: the Memory tab and its routes under ``data/plugin/tbmem/``.

Routes (all GET; JSON unless said otherwise):

* ``runs``: every run, grouped by experiment with ranks together, and whether it has memory tags.
* ``overview?run=R&breakdown=category|dtype|device|module&points=N``: the chart.
* ``at?run=R&step=S``: the record nearest to S (exact readings) and the census nearest to S.
* ``snapshots?run=R``: the run's snapshots, each with an opaque ``id``.
* ``snapshot?run=R&id=ID``: the offline viewer page of one snapshot (HTML).
* ``findings?run=R``: leak findings and the ``tbmem report`` summary.
* ``compare?run=A&run=B[&run=...]&align=auto|step|phase&points=N``: ``tbmem compare``'s rows for these
  runs and their memory on shared axes (the compare view).
* ``ranks?group=G``: per-rank peaks of a multi-rank group.
* ``profiles?run=R``: the run's profile windows; ``profile?run=R&name=N``: one window's offline summary;
  ``profile_trace?run=R&name=N``: its trace file (gzip'd Chrome trace), to download or open in Perfetto.
* ``index.js``, ``chart.js``, ``compare.js``, ``util.js`` and ``static/*``: the page (given
  :mod:`tbmem._internal.palette`'s colours) and the vendored uPlot.

The client names runs and ids, never paths (see :mod:`tbmem._internal.plugin.paths`). This module
imports only the standard library, numpy, tensorboard, werkzeug and torch-free parts of
tbmem; pandas is imported only for the run summary and the compare view, on request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from typing import Any, Callable, cast

import numpy as np
from tensorboard import errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tbmem._internal import palette
from tbmem._internal.logdir.census_log import parse_census_markdown
from tbmem._internal.logdir.layout import split_rank
from tbmem._internal.logdir.reader import LogdirReader
from tbmem._internal.logdir.runs import group_runs
from tbmem._internal.plugin import charts
from tbmem._internal.plugin.compare import ALIGNS, MAX_RUNS, comparison
from tbmem._internal.plugin.convert import DEFAULT_BUDGET_MB
from tbmem._internal.plugin.findings import SUMMARY_PREFIXES, findings, finite
from tbmem._internal.plugin.marks import snapshot_marks, spike_marks
from tbmem._internal.plugin.paths import RunDirs
from tbmem._internal.plugin.profiles import ProfileError, list_windows, trace_file, window_summary
from tbmem._internal.plugin.rank_table import JobTables, RankTableError
from tbmem._internal.plugin.runs import PEAK_TAGS, rank_peaks
from tbmem._internal.plugin.series import ScalarCache
from tbmem._internal.plugin.snapshots import SnapshotError, SnapshotPages
from tbmem._internal.tags import TAGS

#: werkzeug's ``Request.application`` for the plugin's methods: its stubs type it for plain functions
#: of a request, while the bound method it wraps here takes ``self`` first.
_route = cast(Callable[[Callable[..., Any]], Any], wrappers.Request.application)

__all__ = ["MemoryPlugin", "PLUGIN_NAME"]

PLUGIN_NAME = "tbmem"
_STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# route -> (file under static/, content type); nothing else is ever read from disk for a static route
_ASSETS = {
    "/index.js": ("index.js", "text/javascript"),
    "/chart.js": ("chart.js", "text/javascript"),
    "/compare.js": ("compare.js", "text/javascript"),
    "/ranks.js": ("ranks.js", "text/javascript"),
    "/util.js": ("util.js", "text/javascript"),
    "/profiles.js": ("profiles.js", "text/javascript"),
    "/static/style.css": ("style.css", "text/css"),
    "/static/uPlot.iife.min.js": ("vendor/uplot/uPlot.iife.min.js", "text/javascript"),
    "/static/uPlot.min.css": ("vendor/uplot/uPlot.min.css", "text/css"),
}
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\btype=\"application/json\")[^>]*>(.*?)</script>", re.S)
_TEXT_TAG = TAGS["census_text"].tag
# where index.js receives tbmem._internal.palette's colours (one definition for the tab, report.png and the notebook)
_PALETTE_SLOT = re.compile(rb"/\*tbmem:palette\*/.*?/\*end\*/", re.S)
_CENSUS_PREFIX = "Memory/Tensor_Category/"


def _json(request: Any, obj: Any, code: int = 200) -> Any:
    # serialised here: TensorBoard's Respond would walk every value first (json_util.Cleanse). The large
    # documents hold no NaN or infinity (None already); a reading can (a diverged loss): then walk once.
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(finite(obj), separators=(",", ":"), allow_nan=False)
    return http_util.Respond(request, text, "application/json", code=code)


def _int_arg(request: Any, name: str, default: int | None = None, lo: int = -(2**62), hi: int = 2**62) -> int:
    raw = request.args.get(name)
    if raw is None and default is not None:
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(f"{name} must be an integer") from None
    return min(max(value, lo), hi)


class MemoryPlugin(base_plugin.TBPlugin):
    """The Memory tab. Constructed by TensorBoard through :class:`tbmem._internal.plugin.loader.MemoryPluginLoader`.

    Args:
        context: TensorBoard's ``TBContext``: its ``data_provider`` serves the scalars and texts,
            its ``logdir`` (or ``flags.logdir_spec``) bounds every side file read.

    Example:
        >>> import tempfile
        >>> from tensorboard.plugins import base_plugin
        >>> plugin = MemoryPlugin(base_plugin.TBContext(logdir=tempfile.mkdtemp()))
        >>> plugin.frontend_metadata().tab_name, sorted(plugin.get_plugin_apps())[:3]
        ('Memory', ['/at', '/chart.js', '/compare'])
    """

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._provider = context.data_provider
        self._multiplexer = context.multiplexer
        self._dirs = RunDirs(context)
        # the side files of TensorBoard's runs, read by the logdir reader `tbmem report` and the notebook share
        self._logdir = LogdirReader(run_dir=self._dirs.run_dir)
        self._cache = ScalarCache(self._provider)
        self._tables = JobTables()  # compact jobs' Parquet rank tables (tbmem._internal.plugin.rank_table)
        self._pages = SnapshotPages(budget_mb=getattr(context.flags, "tbmem_snapshot_memory_mb", None)
                                    or DEFAULT_BUDGET_MB)
        self._active = False

    # --- TBPlugin -----------------------------------------------------------------------
    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Memory")

    def is_active(self) -> bool:
        """Whether any run has a ``Memory/`` tag; once true it stays true (data is never unlogged)."""
        if not self._active:
            self._active = self._has_memory_tags()
        return self._active

    def _has_memory_tags(self) -> bool:
        if self._multiplexer is not None:  # a dict walk, no event traversal
            meta = self._multiplexer.AllSummaryMetadata()
            return any(t.startswith("Memory/") for tags in meta.values() for t in tags)
        if self._provider is None:
            return False
        from tensorboard import context as tb_context

        listing = self._cache.listing(tb_context.RequestContext(), "")
        return any(t.startswith("Memory/") for tags in listing.values() for t in tags)

    def get_plugin_apps(self) -> dict[str, Callable]:
        apps: dict[str, Callable] = {route: self._asset_app(route) for route in _ASSETS}
        apps.update({"/runs": self._serve_runs, "/overview": self._serve_overview, "/at": self._serve_at,
                     "/snapshots": self._serve_snapshots, "/snapshot": self._serve_snapshot,
                     "/findings": self._serve_findings, "/ranks": self._serve_ranks, "/compare": self._serve_compare,
                     "/profiles": self._serve_profiles, "/profile": self._serve_profile,
                     "/profile_trace": self._serve_profile_trace,
                     "/heatmap": self._serve_heatmap, "/rank_series": self._serve_rank_series})
        return apps

    # --- helpers --------------------------------------------------------------------------
    def _asset_app(self, route: str) -> Callable:
        name, content_type = _ASSETS[route]

        @wrappers.Request.application
        def serve(request: Any) -> Any:
            with open(os.path.join(_STATIC, name), "rb") as fh:
                body = fh.read()
            if name == "index.js":
                colors = json.dumps(palette.as_json(), separators=(",", ":")).encode()
                body = _PALETTE_SLOT.sub(lambda _m: colors, body, count=1)
            return http_util.Respond(request, body, content_type)

        return serve

    @staticmethod
    def _ids(request: Any) -> tuple[Any, str]:
        return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)

    def _run_names(self, ctx: Any, eid: str) -> list[str]:
        return sorted(r.run_name for r in self._provider.list_runs(ctx, experiment_id=eid))

    def _run(self, request: Any) -> tuple[Any, str, str]:
        """(ctx, eid, run) for the ``run`` argument; 404 unless TensorBoard lists that run."""
        ctx, eid = self._ids(request)
        run = request.args.get("run")
        if not run or run not in self._run_names(ctx, eid):
            raise errors.NotFoundError("unknown run")
        return ctx, eid, run

    def _series(self, ctx: Any, eid: str, run: str, want: Callable[[str], bool]) -> tuple[dict, list[str]]:
        listing = self._cache.listing(ctx, eid, [run]).get(run, {})
        tags = [t for t in listing if want(t)]
        return self._cache.get(ctx, eid, run, tags, listing=listing), list(listing)

    def _snapshots(self, run: str) -> list:
        return self._logdir.snapshots(run)

    def _snapshot_page(self, run: str, sid: str) -> str:
        """The page of snapshot ``sid`` of ``run``: found by listing, opened below the run's root."""
        found = self._dirs.run_dir(run)
        entry = next((e for e in self._logdir.snapshots(run) if e.id == sid), None) if found and sid else None
        if entry is None or found is None:
            raise errors.NotFoundError("unknown snapshot id")
        return self._pages.page(entry, found[1])

    # --- routes ---------------------------------------------------------------------------
    @_route
    def _serve_runs(self, request: Any) -> Any:
        ctx, eid = self._ids(request)
        names = self._run_names(ctx, eid)
        listing = self._cache.listing(ctx, eid)
        memory = {r for r, tags in listing.items() if any(t.startswith("Memory/") for t in tags)}
        census = {r for r, tags in listing.items() if any(t.startswith(_CENSUS_PREFIX) for t in tags)}
        # the wall time of a run's latest scalar: the page opens on the most recent run with a census
        last = {r: max((ts.max_wall_time for ts in tags.values()), default=None) for r, tags in listing.items()}
        groups = group_runs(names)
        for g in groups:
            for m in g["members"]:
                m.update(memory=m["run"] in memory, census=m["run"] in census, last_time=last.get(m["run"]))
            g["memory"] = any(m["memory"] for m in g["members"])
            g["census"] = any(m["census"] for m in g["members"])
        return _json(request, {"groups": groups})

    @_route
    def _serve_overview(self, request: Any) -> Any:
        ctx, eid, run = self._run(request)
        breakdown = request.args.get("breakdown", "category")
        if breakdown not in charts.BREAKDOWNS:
            raise errors.InvalidArgumentError(f"breakdown must be one of {', '.join(charts.BREAKDOWNS)}")
        points = _int_arg(request, "points", 1000, lo=50, hi=10_000)
        lines = {TAGS[k].tag for group in charts.LINE_GROUPS.values() for k, _ in group}
        ooms = TAGS["vram_ooms"].tag
        listing = self._cache.listing(ctx, eid, [run]).get(run, {})
        losses = self._logdir.loss_tags(run)  # the run's own (its settings side file), TensorBoard's process's
        tags = [t for t in listing if t in lines or t == ooms or charts.breakdown_tags([t], breakdown)
                or charts.is_step_loss(t, losses)]
        # quick=1: a series longer than a few points per pixel is first drawn from a sample the data
        # provider draws (milliseconds on the Rust server); the page then asks for the exact view. The
        # Python loader converts every record before sampling, so there a sample would cost a second read.
        quick = request.args.get("quick") == "1" and self._multiplexer is None
        series, sampled = self._cache.get_sampled(ctx, eid, run, tags, listing=listing,
                                                  sample=8 * points if quick else None)
        doc = charts.overview(series, breakdown=breakdown, points=points, all_tags=list(listing), loss_patterns=losses)
        doc["sampled"] = sorted(sampled)
        snapshots, found = self._snapshots(run), self._dirs.run_dir(run)
        spikes = spike_marks(found[0], found[1], snapshots) if found else []
        marks = snapshot_marks(snapshots, {m["id"] for m in spikes}) + spikes
        if ooms in series:  # the allocator's OOM counter went up in this record
            s = series[ooms]
            for i in range(1, len(s.values)):
                if s.values[i] > s.values[i - 1]:
                    marks.append({"step": int(s.steps[i]), "kind": "oom", "id": None,
                                  "label": f"out of memory (allocator count {s.values[i]:g})"})
        if any(m["kind"] == "oom" for m in marks):  # issue 38: the mark says why (the run's explanation text)
            why = self._oom_texts(ctx, eid, run)
            for m in marks:
                if m["kind"] == "oom" and m["step"] in why:
                    m["why"] = why[m["step"]]
                    m["label"] += ": " + why[m["step"]].split("\n", 1)[0].split(" ran out of memory: ", 1)[-1]
        doc.update(run=run, marks=marks)
        return _json(request, doc)

    def _oom_texts(self, ctx: Any, eid: str, run: str) -> dict[int, str]:
        """The out-of-memory explanations the run wrote (tbmem._internal.oom), by step."""
        from tensorboard.data import provider as tbp

        listing = self._provider.list_tensors(ctx, experiment_id=eid, plugin_name="text",
                                              run_tag_filter=tbp.RunTagFilter(runs=[run])).get(run, {})
        tags = [t for t in listing if t.startswith(TAGS["oom_text"].tag)]  # torch's add_text appends /text_summary
        if not tags:
            return {}
        data = self._provider.read_tensors(ctx, experiment_id=eid, plugin_name="text", downsample=1 << 40,
                                           run_tag_filter=tbp.RunTagFilter(runs=[run], tags=tags[:1]))
        out = {}
        for datum in data.get(run, {}).get(tags[0], []):
            raw = datum.numpy.reshape(-1)[0] if datum.numpy.size else b""
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            out[int(datum.step)] = text.strip().strip("`").strip()
        return out

    @_route
    def _serve_at(self, request: Any) -> Any:
        ctx, eid, run = self._run(request)
        step = _int_arg(request, "step")
        series, _ = self._series(ctx, eid, run, lambda t: t.startswith(SUMMARY_PREFIXES))
        side = self._logdir.census(run)
        census_steps = set(side)
        for tag in charts.census_tags(series):
            census_steps.update(int(s) for s in series[tag].steps)
        at = charts.nearest(np.array(sorted(census_steps), dtype=np.int64), step)
        census = None
        if at is not None:
            if at in side:
                census = dict(side[at], source="census.jsonl", approx=False)
            else:
                census = charts.census_from_scalars(series, at)
                census["top"] = self._text_top(ctx, eid, run, at)
        return _json(request, {"run": run, "step": step, "record": charts.record_at(series, step),
                               "census": census})

    def _text_top(self, ctx: Any, eid: str, run: str, step: int) -> list | None:
        """The top-K rows of the census's markdown text at ``step``, if TensorBoard kept it."""
        from tensorboard.data import provider as tbp

        listing = self._provider.list_tensors(ctx, experiment_id=eid, plugin_name="text",
                                              run_tag_filter=tbp.RunTagFilter(runs=[run])).get(run, {})
        tags = [t for t in listing if t.startswith(_TEXT_TAG)]
        if not tags:
            return None
        data = self._provider.read_tensors(ctx, experiment_id=eid, plugin_name="text", downsample=1 << 40,
                                           run_tag_filter=tbp.RunTagFilter(runs=[run], tags=tags[:1]))
        for datum in data.get(run, {}).get(tags[0], []):
            if datum.step == step:
                raw = datum.numpy.reshape(-1)[0] if datum.numpy.size else b""
                text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                return parse_census_markdown(text)
        return None

    @_route
    def _serve_snapshots(self, request: Any) -> Any:
        _, _, run = self._run(request)
        return _json(request, [e.to_json() for e in self._snapshots(run)])

    @_route
    def _serve_snapshot(self, request: Any) -> Any:
        _, _, run = self._run(request)
        try:
            html = self._snapshot_page(run, request.args.get("id", ""))
        except SnapshotError as exc:
            return _json(request, {"error": str(exc)}, code=exc.status)
        hashes = [base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode("ascii")
                  for body in _INLINE_SCRIPT.findall(html)]
        return http_util.Respond(request, html, "text/html", csp_scripts_sha256s=hashes)

    def _profile_run(self, request: Any) -> tuple[str, str]:
        _, _, run = self._run(request)
        found = self._dirs.run_dir(run)
        if not found:
            raise errors.NotFoundError("unknown run")
        return found

    @_route
    def _serve_profiles(self, request: Any) -> Any:
        return _json(request, list_windows(self._profile_run(request)))

    @_route
    def _serve_profile(self, request: Any) -> Any:
        try:
            return _json(request, window_summary(self._profile_run(request), request.args.get("name", "")))
        except ProfileError as exc:
            return _json(request, {"error": str(exc)}, code=exc.status)

    @_route
    def _serve_profile_trace(self, request: Any) -> Any:
        name = request.args.get("name", "")
        try:
            body = trace_file(self._profile_run(request), name)
        except ProfileError as exc:
            return _json(request, {"error": str(exc)}, code=exc.status)
        response = http_util.Respond(request, body, "application/gzip")
        response.headers["Content-Disposition"] = f'attachment; filename="{name}"'  # a listed TRACE_FILE name
        return response

    @_route
    def _serve_findings(self, request: Any) -> Any:
        ctx, eid, run = self._run(request)
        series, _ = self._series(ctx, eid, run, lambda t: t.startswith(SUMMARY_PREFIXES))
        return _json(request, dict(findings(run, series), run=run))

    @_route
    def _serve_compare(self, request: Any) -> Any:
        ctx, eid = self._ids(request)
        runs = request.args.getlist("run")
        known = set(self._run_names(ctx, eid))
        if not 2 <= len(set(runs)) == len(runs) <= MAX_RUNS or not all(r in known for r in runs):
            raise errors.InvalidArgumentError(f"name 2 to {MAX_RUNS} different runs TensorBoard lists")
        align = request.args.get("align", "auto")
        if align not in ALIGNS:
            raise errors.InvalidArgumentError(f"align must be one of {', '.join(ALIGNS)}")
        points = _int_arg(request, "points", 1000, lo=50, hi=10_000)
        per_run = {r: self._series(ctx, eid, r, lambda t: t.startswith(SUMMARY_PREFIXES))[0] for r in runs}
        return _json(request, dict(comparison(per_run, align=align, points=points), runs=runs))

    @_route
    def _serve_ranks(self, request: Any) -> Any:
        ctx, eid = self._ids(request)
        group = request.args.get("group")
        members = [r for r in self._run_names(ctx, eid) if split_rank(r)[0] == group]
        if not group or not members:
            raise errors.NotFoundError("unknown group")
        job = self._job_dir(members)
        if job is not None:  # a compact job: every rank from its rank tables, a run's name where it has one
            try:
                rows = self._tables.peaks(*job)
            except RankTableError as exc:
                return _json(request, {"error": str(exc)}, code=exc.status)
            runs = {split_rank(r)[1]: r for r in members}
            for row in rows:
                row["run"] = runs.get(row["rank"])
            return _json(request, {"group": group, "compact": True, "ranks": rows,
                                   "skipped": self._tables.skipped(*job)})
        wanted = {t for tags in PEAK_TAGS.values() for t in tags}
        listing = self._cache.listing(ctx, eid, members)
        per_run = {r: self._cache.get(ctx, eid, r, [t for t in listing.get(r, {}) if t in wanted],
                                      listing=listing.get(r, {})) for r in members}
        return _json(request, {"group": group, "ranks": rank_peaks(per_run)})

    def _job_dir(self, members: list[str]) -> tuple[str, str] | None:
        """(job folder, its root) of a compact job's member runs, or None (per-rank job, not local)."""
        for run in members:
            if split_rank(run)[1] is None:
                continue
            found = self._dirs.run_dir(run)
            if found is not None:
                job = os.path.dirname(found[0])
                return (job, found[1]) if job.startswith(found[1]) and JobTables.has_tables(job) else None
        return None

    def _compact_group(self, request: Any) -> tuple[str, tuple[str, str]]:
        ctx, eid = self._ids(request)
        group = request.args.get("group")
        members = [r for r in self._run_names(ctx, eid) if split_rank(r)[0] == group]
        job = self._job_dir(members) if group and members else None
        if job is None:
            raise errors.NotFoundError("no compact job of that name")
        return group, job

    @_route
    def _serve_heatmap(self, request: Any) -> Any:
        group, job = self._compact_group(request)
        columns = _int_arg(request, "columns", 200, lo=10, hi=1000)
        try:
            return _json(request, {"group": group, **self._tables.heatmap(*job, columns=columns)})
        except RankTableError as exc:
            return _json(request, {"error": str(exc)}, code=exc.status)

    @_route
    def _serve_rank_series(self, request: Any) -> Any:
        group, job = self._compact_group(request)
        rank = _int_arg(request, "rank", lo=0, hi=2**31 - 1)
        try:
            return _json(request, {"group": group, "rank": rank, "series": self._tables.rank_series(*job, rank)})
        except RankTableError as exc:
            return _json(request, {"error": str(exc)}, code=exc.status)
