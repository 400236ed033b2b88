"""The layout of a tbmem logdir, as data: folders, file names, side files and their format versions.

Everything that writes a run (:class:`tbmem.MemoryWriter`, the snapshot store, the ranks) takes
its names from here, and everything that reads one (the Memory tab, ``tbmem report`` and the
analysis API, the notebook) finds files by them::

    <logdir>/                                 what `tensorboard --logdir` and `tbmem report` are given
      <run>/                                  MemoryWriter(log_dir); default runs/<date>_<host>
        events.out.tfevents.*                 TensorBoard's event files: scalars and texts (tbmem._internal.tags)
        plugins/tbmem/                        tbmem's side files (TensorBoard's folder per plugin)
          census.jsonl                        every census, one JSON line each (tbmem._internal.logdir.census_log)
          settings.jsonl                      what its readers need of the run's configuration: its loss tags,
                                              its module depth (tbmem._internal.logdir.settings)
          <kind>_rank<r>_step<000000123>.json.gz   a snapshot (tbmem._internal.snapshot.store writes it), with its
          <kind>_rank<r>_step<000000123>.html      offline page and, from CUDA, PyTorch's own .pickle;
          <kind>_rank<r>_step<000000123>-2.json.gz a second writer's snapshot of the same name
          traces/step<000000123>/rank<r>.pt.trace.json.gz   a profile window's Chrome trace, a folder per window
                                              (tbmem._internal.logdir.traces; HTA takes the folder)
          .tmp-<pid>-<host>-<random>.part     a snapshot file being written
      job_<id>/rank<r>/                       under torch.distributed: one run per rank
      job_<id>/ranks/node<n>.parquet          compact layout: every rank's records, one file per node

A run is a folder that directly holds event files (TensorBoard's rule): a rank folder is a run
of its own, grouped with its siblings by :func:`split_rank`. :data:`FORMATS` lists each file
format with its current version, the one module that writes it, the one that reads it and how
runs written before that version are read.

Example:
    >>> from tbmem._internal.logdir.layout import SNAPSHOT_FILE, snapshot_name, split_rank
    >>> snapshot_name("oom", rank=1, step=42, ext="json.gz")
    'oom_rank1_step000000042.json.gz'
    >>> SNAPSHOT_FILE.match("oom_rank1_step000000042-2.html").group("kind", "rank", "step", "dup", "ext")
    ('oom', '1', '000000042', '2', 'html')
    >>> split_rank("exp/rank3"), split_rank("rank0"), split_rank("exp")
    (('exp', 3), ('.', 0), ('exp', None))
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

__all__ = ["PLUGIN_DIR", "CENSUS_LOG", "SPIKES_LOG", "SETTINGS_LOG", "EVENT_FILE_MARK", "RANK_DIR_PREFIX", "RANK_DIR", "SNAPSHOT_EXTS",
           "SNAPSHOT_FILE", "TEMP_FILE", "TEXT_SUFFIX", "Format", "FORMATS", "plugin_dir", "census_log_path",
           "rank_dir", "split_rank", "snapshot_name", "temp_prefix", "default_run_dir", "job_dir"]

#: tbmem's folder inside a run: TensorBoard's ``plugins/<plugin name>``.
PLUGIN_DIR = os.path.join("plugins", "tbmem")
#: The census side file, relative to the run.
CENSUS_LOG = os.path.join(PLUGIN_DIR, "census.jsonl")
#: The loss-spike side file, relative to the run (tbmem._internal.spikes).
SPIKES_LOG = os.path.join(PLUGIN_DIR, "spikes.jsonl")
#: The run's settings its readers need (loss tags, module depth), relative to the run (tbmem._internal.logdir.settings).
SETTINGS_LOG = os.path.join(PLUGIN_DIR, "settings.jsonl")
#: In the name of every TensorBoard event file (``events.out.tfevents.<time>.<host>...``).
EVENT_FILE_MARK = "tfevents"
#: torch's ``add_text`` appends it to the tag it is given; readers take it off.
TEXT_SUFFIX = "/text_summary"
#: A rank's run folder is ``rank<r>`` below the job's folder.
RANK_DIR_PREFIX = "rank"
RANK_DIR = re.compile(rf"^{RANK_DIR_PREFIX}(\d+)$")
#: A snapshot's files: the document (``json.gz``), its offline page (``html``), PyTorch's pickle.
SNAPSHOT_EXTS = ("json.gz", "html", "pickle")
SNAPSHOT_FILE = re.compile(r"^(?P<kind>[a-z]+)_rank(?P<rank>\d+)_step(?P<step>\d{9,})(?:-(?P<dup>\d+))?"
                           r"\.(?P<ext>json\.gz|html|pickle)$")
#: A snapshot file being written: named after its writer's process and host (a killed writer's are removed).
TEMP_FILE = re.compile(r"^\.tmp-(?P<pid>\d+)-(?P<host>[A-Za-z0-9_.]+)-[A-Za-z0-9_]+\.part$")


@dataclass(frozen=True)
class Format:
    """One file format of a run: where it is, its version, who writes and who reads it.

    Attributes:
        name: What the format is called in the docs.
        path: Where its files are, relative to the run.
        version: The version written now.
        writer: The one module that writes it.
        reader: The one module that reads it (TensorBoard reads the event files for the tab).
        older: How a run written before ``version`` is read.
    """

    name: str
    path: str
    version: int
    writer: str
    reader: str
    older: str


#: Every file format of a run. A change of a format bumps its version here, and its reader keeps
#: reading the versions before (the tests in tests/logdir/ and tests/analysis/ hold old runs).
FORMATS: tuple[Format, ...] = (
    Format(name="event tags", path="events.out.tfevents.*", version=2,
           writer="tbmem._internal.writer (its events encoded by tbmem._internal._direct_events)",
           reader="tbmem._internal.logdir.events (TensorBoard's own loader for the Memory tab)",
           older="version 1, tbmem 0.1's tag names: read under their current names (tbmem._internal.tags.RENAMED, "
                 "tbmem._internal.logdir.events.current_name)"),
    Format(name="census side file", path=CENSUS_LOG, version=1,
           writer="tbmem._internal.logdir.census_log (append_census)", reader="tbmem._internal.logdir.census_log (CensusLog)",
           older="version 0 (none): the census's markdown table in the text tag Memory/Large_Tensors/top_k, "
                 "which TensorBoard keeps 10 of per run (tbmem._internal.logdir.census_log.parse_census_markdown; bytes "
                 "rounded to 0.001 MB)"),
    Format(name="spikes side file", path=SPIKES_LOG, version=1,
           writer="tbmem._internal.logdir.spikes (append_spike, called by tbmem._internal.spikes.SpikeMonitor)",
           reader="tbmem._internal.logdir.spikes (read_spikes)",
           older="version 0 (none): runs from before spikes were detected have no spikes to read"),
    Format(name="settings side file", path=SETTINGS_LOG, version=1,
           writer="tbmem._internal.logdir.settings (append_settings, called by tbmem._internal.writer)",
           reader="tbmem._internal.logdir.settings (read_settings)",
           older="version 0 (none): runs from before read with the built-in loss tags (and TBMEM_LOSS_TAGS of "
                 "the reading process); their by-module keys are in their census lines as written"),
    Format(name="profile trace", path=os.path.join(PLUGIN_DIR, "traces", "step<n>", "rank<r>.pt.trace.json.gz"),
           version=2, writer="tbmem._internal.logdir.traces (write_trace, called by tbmem._internal.profile.window)",
           reader="tbmem._internal.logdir.traces (list_traces, read_trace)",
           older="version 1: plugins/tbmem/trace_rank<r>_step<n>.pt.trace.json.gz, listed and read as version 2; "
                 "version 0 (none): runs from before profile windows have no traces to read"),
    Format(name="snapshot", path=os.path.join(PLUGIN_DIR, "<kind>_rank<r>_step<n>.json.gz"), version=2,
           writer="tbmem._internal.snapshot.store (named here), its document by tbmem._internal.snapshot.schema",
           reader="tbmem._internal.snapshot.readers (listed by tbmem._internal.logdir.snapshots)",
           older="version 1 (one device): read in version 2's shape by tbmem._internal.snapshot.schema"),
    Format(name="rank table", path="../ranks/node<n>.parquet (in the job's folder, beside rank<r>/)", version=1,
           writer="tbmem._internal.logdir.rank_table (RankTableWriter, fed by tbmem._internal.ranks.compact)",
           reader="tbmem._internal.logdir.rank_table (read_rank_table; tbmem._internal.analysis.rank_table queries it)",
           older="version 0 (none): jobs written per rank have every rank's records in its rank<r> run"),
)


def plugin_dir(run_dir: str) -> str:
    """The run's side-file folder."""
    return os.path.join(run_dir, PLUGIN_DIR)


def census_log_path(run_dir: str) -> str:
    """The census side file of a run directory."""
    return os.path.join(run_dir, CENSUS_LOG)


def rank_dir(log_dir: str, rank: int) -> str:
    """``<log_dir>/rank<r>``: a rank's run folder below its job's folder."""
    return os.path.join(log_dir, f"{RANK_DIR_PREFIX}{rank}")


def split_rank(run: str) -> tuple[str, int | None]:
    """(group, rank) of a run name: ``exp/rank3`` -> (``exp``, 3); ``rank3`` -> (``.``, 3); ``exp`` -> (``exp``, None)."""
    head, _, last = run.rpartition("/")
    m = RANK_DIR.match(last)
    if m:
        return head or ".", int(m.group(1))
    return run, None


def snapshot_name(kind: str, *, rank: int, step: int, ext: str, dup: int = 1) -> str:
    """The file name of one snapshot file (``dup`` > 1: the name taken when another writer holds the first)."""
    suffix = f"-{dup}" if dup > 1 else ""
    return f"{kind}_rank{rank}_step{step:09d}{suffix}.{ext}"


def temp_prefix(pid: int, host: str) -> str:
    """The start of a temporary file's name (``tempfile`` adds the random part and ``.part``)."""
    return f".tmp-{pid}-{host}-"


def default_run_dir() -> str:
    """SummaryWriter's default run folder, ``runs/<date>_<host>``."""
    import socket

    return os.path.join("runs", time.strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname())


def job_dir() -> str:
    """``runs/job_<id>``: one folder for every rank of a job started without a log_dir (the rank folders below)."""
    job = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", f"job_{job}")
