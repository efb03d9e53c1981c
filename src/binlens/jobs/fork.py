"""The forked function builder: the first functions' rows built in a child beside the references.

Once every function's code is found, the references with the strings and each function's blocks
are independent. With two CPUs a forked child builds the first functions (by address) and their
rows while the analysis process collects the references and then builds the other functions, each
on its own CPU. The child writes its rows to a temporary file a batch at a time and sends only
their spans and counts (`binlens.frames.write_last_frame`); the save reads the batches back one
at a time, so neither process holds the child's rows whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from binlens.errors import BinlensError
from binlens.frames import load_frame, write_last_frame

if TYPE_CHECKING:
    from binlens.analysis.engine import Explored


def parallel() -> bool:
    """Build the functions in a forked process beside the references: where fork exists, this
    process may run on two CPUs or more, and the machine has memory for the child's copied pages
    (BINLENS_SERIAL=1 turns it off)."""
    if not hasattr(os, "fork") or os.environ.get("BINLENS_SERIAL") == "1":
        return False
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpus >= 2 and memory_allows_fork()


def memory_allows_fork(meminfo: str = "/proc/meminfo") -> bool:
    """Is this process's resident memory under half of what the machine has available? The child
    copies the pages both touch: on gcc's cc1 (1,079 MiB) the machine's used memory rose 1.47 GiB.
    True where /proc does not say (not Linux)."""
    try:
        with open(meminfo) as fh:
            info = {line.split(":")[0]: line.split()[1] for line in fh}
        with open("/proc/self/statm") as fh:
            resident_pages = int(fh.read().split()[1])
        available_kib = int(info["MemAvailable"])
    except (OSError, KeyError, ValueError, IndexError):
        return True
    return resident_pages * os.sysconf("SC_PAGE_SIZE") // 1024 < available_kib // 2


def in_two_processes(explored: Explored, keep: Callable[[Any], None]) -> tuple[list, Any, Any]:
    """(strings, references, function rows): a forked child builds the first functions' rows
    (`CHILD_SHARE`) while this process collects the references and builds the others. `keep`
    holds the child's temporary file until the process exits."""
    from binlens.store.analysis_save import merge_function_rows, streamed_function_rows

    split = _split(explored.found.bodies)
    try:
        spool = tempfile.TemporaryFile(prefix="binlens-rows-")  # noqa: SIM115 - kept with the rows
        keep(spool)
    except OSError:  # (no writable temporary directory: the child's rows come through the pipe)
        spool = None
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its functions, then straight out (nothing of the parent's to flush)
        code = 1
        try:
            os.close(read_fd)
            with open(write_fd, "wb") as out:
                try:
                    rows = streamed_function_rows(explored.iter_functions((0, split)), spool=spool)
                except OSError as err:  # (the temporary file's disk is full, ...): the parent says so
                    write_last_frame(out, ("error", f"its function builder could not write its rows: {err}"))
                    raise
                write_last_frame(out, rows)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent reports it; the trace goes to stderr
            import traceback

            traceback.print_exc(file=sys.stderr)
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    child = open(read_fd, "rb")  # noqa: SIM115 - closed before the child is waited for
    frows = None
    try:
        strings, refs = explored.references()
        explored.drop((0, split))  # (the child's functions: their chunks' memory serves the rows)
        mine = streamed_function_rows(explored.iter_functions())
        theirs = load_frame(child)
        if isinstance(theirs, tuple):  # ("error", what the child could not do)
            raise BinlensError("internal", f"the analysis failed: {theirs[1]}")
        if theirs.spooled:
            theirs.spool = spool  # (their rows are in it: `write_analysis` reads them a batch at a time)
        frows = merge_function_rows(theirs, mine)
    except EOFError:
        child.close()
        raise BinlensError("internal", f"the analysis failed: {_child_death(pid)}") from None
    finally:
        child.close()  # (a child still writing gets EPIPE and ends)
        if frows is None:  # this process failed: the child's work is of no use
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return strings, refs, frows


# The child's share of the functions (by chunks): on libc the parent's references and strings take
# about as long as building the other 38% of the functions with their rows.
CHILD_SHARE = 0.62


def _split(bodies: dict) -> int:
    """How many bodies, in address order, the child builds: its share of all their chunks."""
    sizes = [len(bodies[f].chunks) for f in sorted(bodies)]
    goal = CHILD_SHARE * sum(sizes)
    done = 0
    for i, n in enumerate(sizes):
        if done >= goal:
            return i
        done += n
    return len(sizes)


def _child_death(pid: int) -> str:
    """How the function builder ended, as words."""
    try:
        _pid, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return "its function builder stopped"
    if os.WIFSIGNALED(status):
        return f"its function builder was killed by signal {os.WTERMSIG(status)}"
    return f"its function builder stopped (exit status {os.waitstatus_to_exitcode(status)})"
