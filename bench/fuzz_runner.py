"""Run one mutant at a time through binlens's real API in a forked, limited child; classify the end.

The parent imports binlens once, then forks one child per mutant (a fork costs ~10 ms; a fresh
interpreter with binlens's imports ~0.5 s). The child sets `RLIMIT_AS`, sends its stderr to a
file, opens the mutant with `program.open` and `program.get` in a fresh `BINLENS_HOME`, runs the
full analysis (`analysis.start`, waiting) and lists a page of functions, then writes what happened
as JSON. Everything binlens starts on the way (the loader's parser worker and its forked parser,
the analysis process and its forked function builder) is its descendant and inherits the limit.
The child waits for all of them before it ends, so `os.wait4`'s `ru_maxrss` is the peak RSS of
the largest single process of the whole tree.

The parent kills a child (and every process below it) past the wall-clock limit: a hang. It
makes itself a child subreaper, so processes orphaned by a kill come back to it and are reaped.

Outcomes: `ok`; `error` (a BinlensError with a code other than `internal`, or an analysis that
failed cleanly); `crash` (`internal`, an exception that is not a BinlensError, a signal or a
non-zero exit of the child, an analysis process that died); `hang` (the wall-clock limit, or the
API's own analysis timeout); `oom` (MemoryError under the memory limit).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import resource
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
HOOKS = ("raise", "exit", "hang", "oom")  # test hooks: make the child fail on purpose, after program.get


@dataclass
class Job:
    """One mutant to run: its bytes and how they were made."""

    index: int
    fmt: str
    source: str  # path relative to the corpus
    ops: list[str]
    data: bytes


@dataclass
class Record:
    """How one mutant ended."""

    index: int
    fmt: str
    source: str
    ops: list[str]
    size: int
    outcome: str  # ok | error | crash | hang | oom
    code: str | None = None  # the error code (error), or what crashed (crash)
    stage: str | None = None  # program.open | program.get | analysis | function.list
    message: str | None = None
    where: str | None = None  # a crash's innermost frame and exception, from its traceback
    functions: int | None = None
    rss_kib: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0  # user + system CPU of the child and the processes it reaped
    exit: str | None = None  # how the child ended: "exit 0", "signal SIGSEGV", "killed (time limit)"
    kept: str | None = None  # where a failing mutant was saved
    flag: str | None = None  # a clean error that hides a parser failure: kept and listed too

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON data."""
        return asdict(self)


@dataclass
class Limits:
    """Per-mutant limits."""

    timeout_s: float = 60.0
    mem_bytes: int = 2 << 30
    hook: str | None = None


@dataclass
class _Running:
    job: Job
    pid: int
    started: float
    workdir: Path
    killed: bool = False


# ------------------------------------------------------------------------------- the child side
def _child(job: Job, workdir: Path, limits: Limits) -> None:
    """In the forked child: limits, then the API calls; writes result.json and ends with os._exit."""
    code = 0
    try:
        err_fd = os.open(workdir / "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(err_fd, 2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        resource.setrlimit(resource.RLIMIT_AS, (limits.mem_bytes, limits.mem_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.environ["BINLENS_HOME"] = str(workdir / "home")
        result = _calls(workdir / "mutant", workdir / "home", limits)
    except BaseException as err:  # noqa: BLE001 - everything is recorded; the child must end here
        result = {"outcome": "crash", "code": type(err).__name__, "stage": "fuzz child", "message": str(err)[:300]}
        traceback.print_exc()
        code = 1
    try:
        _end_helpers()
        (workdir / "result.json").write_text(json.dumps(result))
        sys.stderr.flush()
    finally:
        os._exit(code)


def _end_helpers() -> None:
    """Wait for the analysis processes and stop the loader's parser worker, so that their peak RSS
    counts in this process's (wait4 reports the largest of the processes a process has reaped)."""
    from binlens.jobs.client import wait_for_processes
    from binlens.loader import isolate

    wait_for_processes(30.0)
    isolate._WORKER.close()  # noqa: SLF001 - the worker is this process's child: reap it


def _calls(path: Path, home: Path, limits: Limits) -> dict[str, Any]:
    """program.open, program.get, the full analysis and a page of functions, as a result dict."""
    import logging

    from binlens.api import invoke
    from binlens.errors import BinlensError
    from binlens.workspace import Config, Workspace

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    ws = Workspace(Config(home=home, roots=[path.parent]))  # the mutant's folder: the server's allowed root
    stage = "program.open"
    try:
        invoke(ws, "program.open", {"path": str(path)})
        stage = "program.get"
        invoke(ws, "program.get", {})
        _hook(limits)
        stage = "analysis"
        wait_ms = int(limits.timeout_s * 2000) + 1000  # past the parent's limit: the parent says "hang"
        try:
            invoke(ws, "analysis.start", {"wait": True, "timeout_ms": wait_ms})
        except BinlensError as err:
            status = invoke(ws, "analysis.get", {})
            if status["status"] != "failed":
                raise
            return _analysis_failure(status.get("error") or err.message)
        status = invoke(ws, "analysis.get", {})
        if status["status"] != "done":
            return {"outcome": "crash", "code": status["status"], "stage": stage, "message": status.get("error")}
        stage = "function.list"
        listed = invoke(ws, "function.list", {"page": {"limit": 20}})
        for f in listed["items"][:3]:
            invoke(ws, "listing.get", {"selector": {"address": f["address"]}, "max_instructions": 20})
        return {"outcome": "ok", "functions": (status.get("counts") or {}).get("functions")}
    except BinlensError as err:
        parser = _parser_failure(err, path) if stage == "program.open" else None
        if parser is not None:
            return parser
        if err.code == "internal":
            return {"outcome": "crash", "code": "internal", "stage": stage, "message": err.message}
        if err.code == "timeout":
            return {"outcome": "hang", "code": "timeout", "stage": stage, "message": err.message}
        return {"outcome": "error", "code": err.code, "stage": stage, "message": err.message[:300]}
    except MemoryError:
        return {"outcome": "oom", "code": "MemoryError", "stage": stage}


_REJECTED = re.compile(r"the parser rejected it \((\w+)\)")


def _parser_failure(err: Any, path: Path) -> dict[str, Any] | None:
    """A clean `invalid_argument` that hides a failure of the format parser (an exception of
    ours or LIEF's, a crash or a time-out of the forked parser): flagged, with the exception's site."""
    if err.code != "invalid_argument":
        return None
    rejected = _REJECTED.search(err.message)
    if rejected:
        code, flag = f"invalid_argument: parser raised {rejected.group(1)}", "parser exception"
        _parser_traceback(path)
    elif "the format parser crashed" in err.message:
        code, flag = f"invalid_argument: parser crashed ({err.details.get('parser')})", "parser crash"
    elif "parsing took longer" in err.message:
        code, flag = "invalid_argument: parse timeout", "parse timeout"
    else:
        return None
    return {"outcome": "error", "code": code, "flag": flag, "stage": "program.open", "message": err.message}


def _parser_traceback(path: Path) -> None:
    """Parse `path` again with LIEF's path of the loader in a forked process that prints the
    exception's traceback to stderr (the loader turns it into a clean error without one)."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(20)
            from binlens.loader.worker import _lief

            _lief(path.read_bytes(), path.name, None)
        except Exception:  # noqa: BLE001 - its traceback is what this process is for
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(0)
    os.waitpid(pid, 0)


def _analysis_failure(message: str) -> dict[str, Any]:
    """Classify a failed analysis by the error it stored (the code itself stays in the worker)."""
    if "MemoryError" in message:
        return {"outcome": "oom", "code": "MemoryError", "stage": "analysis", "message": message}
    if "internal error" in message or "stopped unexpectedly" in message or "function builder" in message:
        return {"outcome": "crash", "code": "internal", "stage": "analysis", "message": message}
    if "took longer than" in message:
        return {"outcome": "hang", "code": "timeout", "stage": "analysis", "message": message}
    return {"outcome": "error", "code": "analysis_failed", "stage": "analysis", "message": message[:300]}


def _hook(limits: Limits) -> None:
    """A test hook's failure, on purpose (tests check that the runner reports each one)."""
    if limits.hook == "raise":
        raise RuntimeError("fuzz test hook: an uncaught exception")
    if limits.hook == "exit":
        os._exit(70)
    if limits.hook == "hang":
        time.sleep(3600)
    if limits.hook == "oom":
        _ = bytearray(limits.mem_bytes)


# ------------------------------------------------------------------------------ the parent side
def _become_subreaper() -> None:
    """Orphans of a killed child come back to this process (Linux), which reaps them."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _descendants(root: int) -> list[int]:
    """Every process below `root`, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def _kill_tree(pid: int) -> None:
    """Stop `pid` and everything below it, then kill them all."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    tree = [pid, *_descendants(pid)]
    for p in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"signal {signal.Signals(sig).name}"
        except ValueError:
            return f"signal {sig}"
    return f"exit {os.waitstatus_to_exitcode(status)}"


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def crash_site(stderr: str) -> str | None:
    """The innermost frame and the exception of the last traceback in `stderr`, on one line."""
    at = stderr.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    frame, exc = None, None
    for line in stderr[at:].splitlines()[1:]:
        m = _FRAME.match(line)
        if m:
            frame = f"{Path(m.group(1)).name}:{m.group(2)} in {m.group(3)}"
        elif line and not line.startswith(" "):
            exc = line.strip()
            break
    return " | ".join(x for x in (frame, exc) if x) or None


def _classify(run: _Running, status: int, usage: Any, elapsed: float) -> Record:
    job = run.job
    rec = Record(job.index, job.fmt, job.source, job.ops, len(job.data), "crash", rss_kib=usage.ru_maxrss,
                 seconds=round(elapsed, 3), cpu_s=round(usage.ru_utime + usage.ru_stime, 3),
                 exit=_how(status))  # fmt: skip
    try:
        stderr = (run.workdir / "stderr.txt").read_text(errors="replace")
    except OSError:
        stderr = ""
    try:
        result = json.loads((run.workdir / "result.json").read_text())
    except (OSError, ValueError):
        result = None
    if run.killed:
        rec.outcome, rec.exit, rec.stage = "hang", "killed (time limit)", "time limit"
        return rec
    if result is None:
        rec.code = rec.exit
        rec.message = "the child ended without a result"
        if "MemoryError" in stderr:
            rec.outcome = "oom"
        rec.where = crash_site(stderr)
        return rec
    rec.outcome = result["outcome"]
    rec.code, rec.stage, rec.message = result.get("code"), result.get("stage"), result.get("message")
    rec.functions, rec.flag = result.get("functions"), result.get("flag")
    if rec.outcome == "ok" and rec.exit != "exit 0":
        rec.outcome, rec.code = "crash", rec.exit
    if rec.outcome in ("crash", "oom", "hang") or rec.flag:
        rec.where = crash_site(stderr)
    return rec


class Runner:
    """Runs jobs `jobs` at a time, each in a forked child under `limits`."""

    def __init__(self, limits: Limits, jobs: int, tmp: Path, keep_dir: Path | None, seed: int) -> None:
        self.limits = limits
        self.jobs = max(1, jobs)
        self.tmp = tmp
        self.keep_dir = keep_dir
        self.seed = seed

    def run(self, jobs: Iterable[Job], progress: Callable[[Record], None] | None = None) -> Iterator[Record]:
        """Run every job; yield each record as its child ends (not in index order)."""
        _prepare_parent()
        _become_subreaper()
        pending = iter(jobs)
        running: dict[int, _Running] = {}
        exhausted = False
        while running or not exhausted:
            while not exhausted and len(running) < self.jobs:
                job = next(pending, None)
                if job is None:
                    exhausted = True
                    break
                run = self._start(job)
                running[run.pid] = run
            reaped = False
            while True:
                try:
                    pid, status, usage = os.wait4(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                reaped = True
                run = running.pop(pid, None)
                if run is None:
                    continue  # an orphan of a killed child, reaped
                rec = _classify(run, status, usage, time.monotonic() - run.started)
                self._finish(run, rec)
                if progress is not None:
                    progress(rec)
                yield rec
            now = time.monotonic()
            for run in running.values():
                if not run.killed and now - run.started > self.limits.timeout_s:
                    run.killed = True
                    _kill_tree(run.pid)
            if not reaped:
                time.sleep(0.01)

    def _start(self, job: Job) -> _Running:
        workdir = self.tmp / f"m{job.index}"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "mutant").write_bytes(job.data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(job, workdir, self.limits)  # never returns
        return _Running(job, pid, time.monotonic(), workdir)

    def _finish(self, run: _Running, rec: Record) -> None:
        if (rec.outcome in ("crash", "hang", "oom") or rec.flag) and self.keep_dir is not None:
            self.keep_dir.mkdir(parents=True, exist_ok=True)
            stem = f"s{self.seed}-i{rec.index}-{rec.fmt}"
            shutil.copyfile(run.workdir / "mutant", self.keep_dir / f"{stem}.bin")
            with contextlib.suppress(OSError):
                shutil.copyfile(run.workdir / "stderr.txt", self.keep_dir / f"{stem}.stderr.txt")
            (self.keep_dir / f"{stem}.json").write_text(json.dumps(rec.to_dict(), indent=1) + "\n")
            rec.kept = str(self.keep_dir / f"{stem}.bin")
        shutil.rmtree(run.workdir, ignore_errors=True)


def _prepare_parent() -> None:
    """Import binlens (the API with its domains, the loader, the analysis client) once, before any
    fork, so each child starts warm."""
    import binlens.api  # noqa: F401 - registers the domains
    import binlens.jobs.client  # noqa: F401
    import binlens.jobs.state  # noqa: F401
    import binlens.loader.isolate  # noqa: F401
    import binlens.workspace  # noqa: F401


@dataclass
class Tally:
    """Counts and figures of a set of records (one format, or all)."""

    mutants: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    crashes: int = 0
    hangs: int = 0
    oom: int = 0
    rss_kib: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)

    def add(self, rec: Record) -> None:
        """Count one record."""
        self.mutants += 1
        if rec.outcome == "ok":
            self.ok += 1
        elif rec.outcome == "error":
            key = rec.code or "?"
            self.errors[key] = self.errors.get(key, 0) + 1
        elif rec.outcome == "crash":
            self.crashes += 1
        elif rec.outcome == "hang":
            self.hangs += 1
        elif rec.outcome == "oom":
            self.oom += 1
        self.rss_kib.append(rec.rss_kib)
        self.seconds.append(rec.seconds)
        self.cpu_s.append(rec.cpu_s)
