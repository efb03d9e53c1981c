"""`binlens corpus index`: many binaries analysed in parallel on Ray into a corpus store.

The driver (this module, in the command's process) finds the distinct executables
(`discover.py`), leaves out those the corpus holds already (so a rerun resumes a killed run), and
hands each remaining file to a Ray task (`worker.py`): as many run as the Ray cluster has CPUs,
and as many again wait in Ray's queue, so a worker goes on to its next file while this process
stores an answer. A file's time budget (`timeout_s`) counts from when it takes a running place.
Each `BinaryRecord` is written to the store as it arrives, one transaction per binary: a killed
run loses at most the files in flight.

A file that fails is one `FileFailure` in the report (and in the store), never the end of the run:
an analysis error is returned by the task as data; a task past its budget is cancelled with its
worker process killed (`ray.cancel(force=True)`); a worker that dies (a crash in native code, the
machine's OOM killer) surfaces as Ray's `WorkerCrashedError` (or another `RayError`) for that
file alone.

A local Ray (`ray.init(address="local")`, `workers` CPUs, no dashboard, quiet) is started on
demand and stopped at the end; `ray_address` connects to a running cluster instead, whose nodes
need binlens installed and the same home path; a Ray already initialised in this process (a test
session's) is used as it is.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from binlens.corpus.discover import Candidate, Discovery, discover
from binlens.corpus.records import BinaryRecord, FileFailure
from binlens.errors import BinlensError
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES

DEFAULT_TIMEOUT_S = 300.0  # one file's budget: the largest libraries of a system analyse in ~1 minute
_OBJECT_STORE_BYTES = 256 << 20  # a local Ray's shared-memory object store (records are small)
_POLL_S = 0.25  # the longest wait for a result before deadlines are checked again


class Store(Protocol):
    """What the indexer needs of a corpus store (`corpus/store.py`)."""

    def indexed(self, name: str) -> set[str]: ...

    def add_binary(self, name: str, record: BinaryRecord) -> bool: ...

    def add_failure(self, name: str, failure: FileFailure) -> None: ...


@dataclass
class IndexOptions:
    """What `binlens corpus index` was asked."""

    corpus: str
    paths: Sequence[str]
    home: Path
    workers: int | None = None  # a local Ray's CPUs (default: all of this machine's)
    ray_address: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES


@dataclass
class IndexReport:
    """How an indexing run went (the CLI prints it; `--json` prints it as it is)."""

    corpus: str
    found: int = 0  # distinct executables found
    duplicates: int = 0  # copies of an executable found under another path (indexed once)
    other_files: int = 0  # files that are not executables
    skipped: int = 0  # distinct executables the corpus held already
    indexed: int = 0  # binaries added by this run
    failed: list[FileFailure] = field(default_factory=list)
    functions: int = 0  # functions of the binaries added by this run
    workers: int = 0
    discover_seconds: float = 0.0
    startup_seconds: float = 0.0  # Ray's start and its workers' (with the analysis's imports)
    seconds: float = 0.0  # from the first file handed to a started worker to the last answer
    task_seconds: float = 0.0  # the indexed files' own times in their workers (analysis, fingerprints)
    ray_address: str | None = None

    @property
    def files_per_s(self) -> float:
        return self.indexed / self.seconds if self.seconds > 0 else 0.0

    @property
    def functions_per_s(self) -> float:
        return self.functions / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data."""
        return {
            "corpus": self.corpus,
            "found": self.found,
            "duplicates": self.duplicates,
            "other_files": self.other_files,
            "skipped": self.skipped,
            "indexed": self.indexed,
            "failed": [{"path": f.path, "sha256": f.sha256, "code": f.code, "message": f.message} for f in self.failed],
            "functions": self.functions,
            "workers": self.workers,
            "discover_seconds": round(self.discover_seconds, 3),
            "startup_seconds": round(self.startup_seconds, 3),
            "seconds": round(self.seconds, 3),
            "task_seconds": round(self.task_seconds, 3),
            "files_per_s": round(self.files_per_s, 3),
            "functions_per_s": round(self.functions_per_s, 1),
            "ray_address": self.ray_address,
        }


@dataclass
class Progress:
    """Where a run is, as the progress display sees it."""

    phase: str  # discovering | starting | indexing | done
    total: int = 0  # files to index by this run
    done: int = 0  # answered (indexed or failed)
    indexed: int = 0
    failed: int = 0
    functions: int = 0
    examined: int = 0  # files examined while discovering
    started: float = field(default_factory=time.monotonic)  # the run's, then the indexing's start
    last: str | None = None  # the last file answered


OnProgress = Callable[[Progress], None]


def _quiet(_p: Progress) -> None:
    return None


# ---------------------------------------------------------------------------------------- Ray
def start_ray(workers: int | None, address: str | None) -> tuple[bool, int, str | None]:
    """Connect to Ray (see the module's text): (whether this call started it, CPUs to use, address)."""
    try:
        import ray
    except ImportError:
        raise BinlensError(
            "unavailable",
            "corpus indexing needs Ray: install binlens with the corpus extra (pip install 'binlens[corpus]')",
            details={"remediation": "pip install 'binlens[corpus]'"},
        ) from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = False
    if address and not ray.is_initialized():
        _reachable(address)
    if not ray.is_initialized():
        common: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
        try:
            if address:
                ray.init(address=address, **common)
            else:
                ray.init(
                    address="local",
                    num_cpus=workers or os.cpu_count() or 1,
                    include_dashboard=False,
                    object_store_memory=_OBJECT_STORE_BYTES,
                    **common,
                )
        except (ConnectionError, RuntimeError, ValueError) as err:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise BinlensError(
                "unavailable",
                f"cannot start or reach {where}: {err}",
                target="/options/ray_address" if address else None,
            ) from None
        started = True
    cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
    if workers and (address or not started):
        cpus = min(cpus, workers)
    gcs = ray.get_runtime_context().gcs_address
    return started, max(1, cpus), gcs


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail at once when a `host:port` Ray address does not answer (`ray.init` would retry for
    minutes); other forms (`auto`, `ray://...`) are left to Ray."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise BinlensError(
            "unavailable",
            f"no Ray cluster answers at {address}: {err.strerror or err}",
            target="/options/ray_address",
        ) from None


def _remote() -> Any:
    """The Ray task that indexes one file: ("ok", BinaryRecord) or ("error", code, message)."""
    import ray

    @ray.remote(num_cpus=1, max_retries=0)
    def index_task(path: str, sha256: str, home: str, max_bytes: int) -> tuple[Any, ...]:
        from binlens.corpus.worker import index_file

        try:
            return ("ok", index_file(path, sha256, home, max_bytes))
        except BinlensError as err:
            return ("error", err.code, err.message)
        except MemoryError:
            return ("error", "internal", "the analysis ran out of memory")
        except Exception as err:  # noqa: BLE001 - one file's failure, reported with the others
            return ("error", "internal", f"the analysis failed: {type(err).__name__}: {err}")

    return index_task


def _warm_up(slots: int) -> None:
    """Start `slots` workers and import the analysis in each, so that no file's time budget pays
    for a worker's start-up (~1-3 s) and the rates measure the indexing."""
    import ray

    @ray.remote(num_cpus=1, max_retries=0)
    def warm() -> int:
        from binlens.corpus.worker import prepare

        prepare()
        time.sleep(0.2)  # (held a moment, so each of the `slots` tasks gets a worker of its own)
        return os.getpid()

    ray.get([warm.remote() for _ in range(slots)])


def _ray_failure(cand: Candidate, err: Exception) -> FileFailure:
    """A Ray error for one file's task, as its failure."""
    import ray.exceptions as rex

    if isinstance(err, rex.WorkerCrashedError | rex.NodeDiedError):
        msg = "the worker analysing it died (a crash in native code, or killed for memory)"
    elif isinstance(err, rex.OutOfMemoryError):
        msg = "the worker analysing it was killed by Ray's memory monitor"
    elif isinstance(err, rex.TaskCancelledError):
        msg = "its task was cancelled"
    else:
        msg = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return FileFailure(cand.path, cand.sha256, "internal", msg)


# ------------------------------------------------------------------------------------- the run
def index(opts: IndexOptions, store: Store, on_progress: OnProgress = _quiet) -> IndexReport:
    """Index `opts.paths` into the corpus `opts.corpus` of `store` (see the module's text)."""
    report = IndexReport(opts.corpus)
    state = Progress("discovering")
    on_progress(state)
    t0 = time.monotonic()

    def examined(n: int) -> None:
        state.examined = n
        on_progress(state)

    found: Discovery = discover(opts.paths, opts.max_file_bytes, examined)
    report.discover_seconds = time.monotonic() - t0
    report.found, report.duplicates, report.other_files = len(found.files), len(found.duplicates), found.other
    for failure in found.failures:
        _fail(store, opts.corpus, report, failure)
    have = store.indexed(opts.corpus)
    todo = [c for c in found.files if c.sha256 not in have]
    report.skipped = len(found.files) - len(todo)
    state.total = len(todo)
    if not todo:
        state.phase = "done"
        on_progress(state)
        return report
    state.phase = "starting"
    on_progress(state)
    t0 = time.monotonic()
    started, slots, address = start_ray(opts.workers, opts.ray_address)
    report.startup_seconds = time.monotonic() - t0
    report.workers, report.ray_address = slots, opts.ray_address
    try:
        _run(opts, store, todo, slots, report, state, on_progress)
    finally:
        if started:
            import ray

            ray.shutdown()
    state.phase = "done"
    on_progress(state)
    return report


def _run(
    opts: IndexOptions,
    store: Store,
    todo: list[Candidate],
    slots: int,
    report: IndexReport,
    state: Progress,
    on_progress: OnProgress,
) -> None:
    """Hand `todo` to Ray, `slots` at a time, and store each answer as it arrives."""
    import ray

    task = _remote()
    t0 = time.monotonic()
    _warm_up(slots)
    report.startup_seconds += time.monotonic() - t0
    home = str(opts.home.resolve())
    pending = deque(todo)
    # file -> [candidate, deadline]: the first `slots` run (a deadline from when they started); the
    # next `slots` wait in Ray's queue (no deadline yet), so a worker never idles while this process
    # stores an answer, and each takes a running place, with its deadline, as one frees up
    inflight: dict[Any, list[Any]] = {}
    state.phase = "indexing"
    t0 = state.started = time.monotonic()  # (the rates shown count from here)
    while pending or inflight:
        while pending and len(inflight) < 2 * slots:
            cand = pending.popleft()
            inflight[task.remote(cand.path, cand.sha256, home, opts.max_file_bytes)] = [cand, None]
        _promote(inflight, slots, opts.timeout_s)
        nearest = min(entry[1] for entry in inflight.values() if entry[1] is not None)
        wait_s = max(0.0, min(_POLL_S, nearest - time.monotonic()))
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=wait_s)
        for ref in ready:
            cand, _deadline = inflight.pop(ref)
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayError as err:
                _fail(store, opts.corpus, report, _ray_failure(cand, err))
            else:
                if answer[0] == "ok":
                    _stored(store, opts.corpus, report, answer[1])
                else:
                    _fail(store, opts.corpus, report, FileFailure(cand.path, cand.sha256, answer[1], answer[2]))
            _step(state, report, cand)
        now = time.monotonic()
        for ref, (cand, deadline) in list(inflight.items()):
            if deadline is not None and now >= deadline and ref not in ready:
                ray.cancel(ref, force=True)  # (kills the worker process: a hung analysis ends with it)
                del inflight[ref]
                message = f"the analysis did not finish within {opts.timeout_s:g} s"
                _fail(store, opts.corpus, report, FileFailure(cand.path, cand.sha256, "timeout", message))
                _step(state, report, cand)
        report.seconds = time.monotonic() - t0
        on_progress(state)  # (at most ~4 times a second while nothing arrives; the display throttles)


def _promote(inflight: dict[Any, list[Any]], slots: int, timeout_s: float) -> None:
    """Start the clock of the oldest queued files while fewer than `slots` run (Ray runs its queue
    in order as workers free up)."""
    running = sum(1 for entry in inflight.values() if entry[1] is not None)
    for entry in inflight.values():
        if running >= slots:
            break
        if entry[1] is None:
            entry[1] = time.monotonic() + timeout_s
            running += 1


def _stored(store: Store, corpus: str, report: IndexReport, record: BinaryRecord) -> None:
    """Write one record; a store that refuses this record (not one that is down) fails the file."""
    try:
        added = store.add_binary(corpus, record)
    except BinlensError as err:
        if err.code in ("unavailable", "busy", "read_only"):
            raise  # (the store itself is gone or refuses all writes: the run cannot go on)
        _fail(store, corpus, report, FileFailure(record.path, record.sha256, err.code, err.message))
        return
    if added:
        report.indexed += 1
        report.functions += len(record.functions)
        report.task_seconds += record.seconds
    else:
        report.skipped += 1  # (another run indexed it meanwhile)


def _fail(store: Store, corpus: str, report: IndexReport, failure: FileFailure) -> None:
    report.failed.append(failure)
    store.add_failure(corpus, failure)


def _step(state: Progress, report: IndexReport, cand: Candidate) -> None:
    state.done += 1
    state.indexed, state.failed, state.functions = report.indexed, len(report.failed), report.functions
    state.last = cand.path
