"""GDB over its machine interface (GDB/MI) as the debugger provider: one gdb process per debug session.

`GdbProvider` finds gdb (`$BINLENS_GDB`, else `gdb` on the PATH) and the MI parser (pygdbmi, the
`binlens[debug]` extra). A `GdbSession` starts `gdb --interpreter=mi3` in a process group of its
own, with asynchronous execution (`mi-async`), so a command answers while the target runs; a
reader thread parses every MI record: command results wake the caller waiting on their token,
stop records become events in a bounded log (read by cursor, awaited with a bound, and passed to
the session's listener). Every wait is bounded: a gdb that does not answer in time is killed with
its group (and the target it started), and the call answers `timeout`.

The target's identity (`TargetIdentity`: pid, start time from /proc/PID/stat, the executable's
device/inode and sha256) is pinned when the target starts or is attached and checked before every
command that touches it: a target that is gone answers `process_exited`, a pid that now names
another process (or another executable) answers `process_changed`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from binlens.errors import BinlensError
from binlens.providers import gdb_emulated
from binlens.providers.base import Availability, ToolVersions
from binlens.providers.gdb_emulated import Emulator
from binlens.providers.gdb_mi import parse_record

if TYPE_CHECKING:
    from binlens.loader.image import Image
from binlens.providers.target import TargetIdentity, process_exited_error, process_start_time

log = logging.getLogger("binlens")

ENV = "BINLENS_GDB"
REMEDIATION = "apt-get install gdb (or set $BINLENS_GDB to a gdb executable)"
PARSER_REMEDIATION = "pip install 'binlens[debug]' (the GDB/MI parser, pygdbmi)"
MAX_EVENTS = 1000  # stop events kept per session; older ones drop off the front of the log
MAX_OUTPUT_TAIL = 4096  # bytes of the target's output reported by `output_tail`
CLOSE_WAIT_S = 2.0
KILL_COMMAND = '-interpreter-exec console "kill"'  # (MI has no command of its own for it)
_VERSION = re.compile(r"GNU gdb .*?(\d+\.\d+(?:\.\d+)*)")
_EXIT_KINDS = {"exited", "exited-normally", "exited-signalled"}
_WATCH_REASONS = {"watchpoint-trigger", "read-watchpoint-trigger", "access-watchpoint-trigger", "watchpoint-scope"}
_STEP_COMMANDS = {"-exec-finish", "-exec-step", "-exec-next", "-exec-step-instruction", "-exec-next-instruction"}
_STEP_REASONS = {"end-stepping-range", "function-finished", "location-reached"}


class GdbProvider:
    """The gdb provider (kind `debugger`)."""

    id = "gdb"
    kind = "debugger"

    def __init__(self) -> None:
        self._versions = ToolVersions("gdb", REMEDIATION, _probe)

    def executable(self) -> str | None:
        """The gdb to run: `$BINLENS_GDB` when set, else the PATH's."""
        return os.environ.get(ENV) or shutil.which("gdb")

    def availability(self) -> Availability:
        """Available when pygdbmi imports and gdb runs and says its version (probed once per file version)."""
        try:
            import pygdbmi.gdbmiparser  # noqa: F401
        except ImportError:
            return Availability(
                False, reason="the GDB/MI parser pygdbmi is not installed", remediation=PARSER_REMEDIATION
            )
        return self._versions.check(self.executable())

    def open_session(self, image: Image) -> GdbSession:
        """A debug session for a target running `image` (gdb starts with `start` or `attach`); a
        program of another architecture is debugged by gdb-multiarch under its emulator."""
        emulator = gdb_emulated.emulator_for(image)
        if emulator is not None:
            return GdbSession(emulator.gdb, image.identity.sha256, emulator)
        return GdbSession(self.executable() or "gdb", image.identity.sha256)


def _probe(exe: str) -> Availability:
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return Availability(False, reason=f"{exe} does not run: {type(err).__name__}", remediation=REMEDIATION)
    m = _VERSION.search((done.stdout.splitlines() or [""])[0])
    if done.returncode != 0 or m is None:
        return Availability(False, reason=f"{exe} is not GNU gdb", remediation=REMEDIATION)
    return Availability(True, version=m.group(1))


PROVIDER = GdbProvider()


# --- the session ----------------------------------------------------------------------------------


Listener = Callable[[dict[str, Any]], None]


def mi_quote(text: str) -> str:
    """`text` as an MI C string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


class GdbSession:
    """One gdb process debugging one target (started or attached), its event log and its identity."""

    def __init__(self, executable: str, sha256: str, emulator: Emulator | None = None) -> None:
        self.executable = executable
        self.emulator = emulator  # a target of another architecture runs under this emulator
        self._emulated: subprocess.Popen[bytes] | None = None
        self.sha256 = sha256  # the program's; the target's executable must have these bytes
        self.state = "idle"  # idle | stopped | running | exited | detached | failed | closed
        self.identity: TargetIdentity | None = None
        self.started = False  # True: gdb started the target (it dies with the session)
        self.exit_code: int | None = None
        self.listener: Listener | None = None
        self.last_stop: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tokens = itertools.count(1)
        self._results: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._cmd_lock = threading.Lock()
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        self._seq = 0
        self._unheard: list[dict[str, Any]] = []  # stop events the listener has not been given yet
        self._tmp = tempfile.TemporaryDirectory(prefix="binlens-debug-")
        self._output = os.path.join(self._tmp.name, "output")
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._targets: list[tuple[int, int]] = []  # (pid, start time) of targets gdb started
        self._final_output: str | None = None  # the output's tail kept when the session closes
        self._tail = b""  # the last bytes of the target's output
        self._drain: threading.Thread | None = None
        self._console: list[str] | None = None  # the console stream of the running `console` call
        self._resumed_by = ""  # the last -exec- command (gdb gives a finish without symbols no stop reason)

    # --- lifecycle ------------------------------------------------------------------------
    def _spawn(self, timeout: float) -> None:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TERM")}
        env.setdefault("PATH", "/usr/bin:/bin")
        self._proc = subprocess.Popen(
            [self.executable, "-nx", "-q", "--interpreter=mi3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            start_new_session=True,  # its own process group: a kill of the group never reaches the server
        )
        self._finalizer = weakref.finalize(self, _kill_all, self._proc, self._targets)
        threading.Thread(target=self._read_loop, args=(self._proc,), daemon=True, name="gdb-mi").start()
        # (may-call-functions off: evaluating an expression or a condition never runs the target's code)
        for command in (
            "-gdb-set mi-async on",
            "-gdb-set pagination off",
            "-gdb-set confirm off",
            "-gdb-set may-call-functions off",
        ):
            self.command(command, timeout=timeout)

    def start(
        self, path: str, args: list[str], env: dict[str, str], cwd: str | None, stdin: bytes | None, timeout: float
    ) -> None:
        """Start gdb and the target `path` with `args` (its stdout and stderr go to a file of the
        session, its stdin reads `stdin` or /dev/null), stopped at its first instruction."""
        self._spawn(timeout)
        stdin_path = "/dev/null"
        if stdin is not None:
            stdin_path = os.path.join(self._tmp.name, "stdin")
            with open(stdin_path, "wb") as f:
                f.write(stdin)
        os.mkfifo(self._output, 0o600)  # read by a thread keeping its end: no output can fill a disk
        self._drain = threading.Thread(target=self._drain_output, daemon=True, name="gdb-target-output")
        self._drain.start()
        if self.emulator is not None:
            self._start_emulated(self.emulator, path, args, env, cwd, stdin_path, timeout)
            return
        self.command(f"-file-exec-and-symbols {mi_quote(path)}", timeout=timeout)
        line = " ".join(shlex.quote(a) for a in args)
        line += f" < {shlex.quote(stdin_path)} > {shlex.quote(self._output)} 2>&1"
        self.command(f"-exec-arguments {line}", timeout=timeout)
        for name, value in env.items():
            self.command(f"-interpreter-exec console {mi_quote(f'set environment {name}={value}')}", timeout=timeout)
        if cwd is not None:
            self.command(f"-interpreter-exec console {mi_quote(f'set cwd {cwd}')}", timeout=timeout)
        self.started = True
        self.command('-interpreter-exec console "starti"', timeout=timeout)
        stop = self.wait_stop(timeout)
        pid = self._inferior_pid(timeout)
        if stop is None or pid is None:
            self.close()
            raise BinlensError("unavailable", "the target did not start", details={"reason": "start_failed"})
        self._pin(pid)
        assert self.identity is not None
        self._targets.append((pid, self.identity.start_time))

    def _start_emulated(
        self,
        emulator: Emulator,
        path: str,
        args: list[str],
        env: dict[str, str],
        cwd: str | None,
        stdin_path: str,
        timeout: float,
    ) -> None:
        """Start the program under its emulator, stopped before its first instruction, and connect
        gdb to the emulator's gdb stub (a Unix socket of the session's directory)."""
        socket = os.path.join(self._tmp.name, "gdb.sock")
        self.started = True
        qemu = self._emulated = gdb_emulated.spawn(
            emulator, path, args, env, cwd, stdin_path, self._output, socket, timeout
        )
        start = process_start_time(qemu.pid)
        if start is not None:
            self._targets.append((qemu.pid, start))
        if emulator.sysroot is not None:
            self.command(f"-gdb-set sysroot {mi_quote(emulator.sysroot)}", timeout=timeout)
        self.command(f"-file-exec-and-symbols {mi_quote(path)}", timeout=timeout)
        self.command(f"-target-select remote {socket}", timeout=timeout)
        if self.wait_stop(timeout) is None:
            self.close()
            raise BinlensError("unavailable", "the target did not start", details={"reason": "start_failed"})
        ident = gdb_emulated.pin(qemu.pid, path, emulator)
        if ident.sha256 != self.sha256:
            self.close()
            raise BinlensError("conflict", f"{path}'s bytes are not the program's", details={"reason": "exe_mismatch"})
        self.identity = ident

    def attach(self, pid: int, timeout: float) -> None:
        """Start gdb and attach it to `pid` (stopped once attached)."""
        if self.emulator is not None:
            raise BinlensError(
                "unsupported",
                f"an emulated {self.emulator.arch} process cannot be attached to; start it with debug.start",
                target="/params/pid",
            )
        self._spawn(timeout)
        self.command(f"-target-attach {pid}", timeout=timeout)
        if self.wait_stop(timeout) is None:
            self.close()
            raise BinlensError("timeout", f"process {pid} did not stop after the attach", details={"pid": pid})
        self._pin(pid)

    def _pin(self, pid: int) -> None:
        ident = TargetIdentity.pin(pid)
        if ident.sha256 != self.sha256:
            self.close()
            raise BinlensError(
                "conflict",
                f"process {pid} runs {ident.exe}, whose bytes are not the program's",
                target="/params/pid",
                details={"reason": "exe_mismatch", "sha256": ident.sha256, "program_sha256": self.sha256},
            )
        self.identity = ident

    def _inferior_pid(self, timeout: float) -> int | None:
        payload = self.command("-list-thread-groups", timeout=timeout)
        for group in payload.get("groups") or []:
            if isinstance(group, dict) and str(group.get("pid", "")).isdigit():
                return int(group["pid"])
        return None

    def close(self) -> None:
        """End the session: a target gdb started is killed, an attached one is detached (when gdb
        still answers), then gdb's process group is killed."""
        proc = self._proc
        if proc is not None and proc.poll() is None and self.state in ("stopped", "running"):
            with contextlib.suppress(BinlensError):
                if self.started:
                    self.command(KILL_COMMAND, timeout=CLOSE_WAIT_S)
                else:
                    if self.state == "running":
                        self.command("-exec-interrupt", timeout=CLOSE_WAIT_S)
                        self.wait_stop(CLOSE_WAIT_S)
                    self.command("-target-detach", timeout=CLOSE_WAIT_S)
        if self.state not in ("exited", "detached", "failed"):
            self.state = "closed"
        self._kill()
        if self.started:  # a reader still waiting for a writer (a target that never ran) is let go
            with contextlib.suppress(OSError):
                os.close(os.open(self._output, os.O_WRONLY | os.O_NONBLOCK))
        if self._emulated is not None:  # (killed with the targets: reaped here)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._emulated.wait(CLOSE_WAIT_S)
        if self._drain is not None:
            self._drain.join(CLOSE_WAIT_S)  # (the target is gone: its last output is on the way)
        if self._final_output is None:
            self._final_output = self.output_tail()
        self._tmp.cleanup()

    def release_if_ended(self) -> None:
        """Close gdb once the target has exited (the log, the state and the output stay)."""
        proc = self._proc
        if self.state == "exited" and proc is not None and proc.poll() is None:
            self.close()

    def _kill(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        with self._cond:
            self._cond.notify_all()

    # --- commands -------------------------------------------------------------------------
    def console(self, text: str, *, timeout: float) -> str:
        """Run a gdb CLI command and return what it printed (its console stream)."""
        self._console = []
        try:
            self.command(f"-interpreter-exec console {mi_quote(text)}", timeout=timeout)
            return "".join(self._console)
        finally:
            self._console = None

    def command(self, text: str, *, timeout: float, check: bool = False) -> dict[str, Any]:
        """Send one MI command and return its result's payload. `check`: the target's identity is
        checked first. An MI error answers `invalid_argument` with gdb's message."""
        if not self._cmd_lock.acquire(timeout=min(timeout, 5.0)):
            raise BinlensError("busy", "the debug session is serving another request; retry shortly")
        try:
            proc = self._proc
            if proc is None or proc.poll() is not None or proc.stdin is None:
                raise self._gone()
            if check:
                self.check_alive()
            token = next(self._tokens)
            if text.startswith("-exec-"):
                self._resumed_by = text.split()[0]
            try:
                proc.stdin.write(f"{token}{text}\n".encode())
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._gone() from None
            deadline = time.monotonic() + timeout
            with self._cond:
                while token not in self._results:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    if proc.poll() is not None:
                        raise self._gone()
                    self._cond.wait(min(left, 0.2))
                record = self._results.pop(token, None)
            if record is None:
                self.state = "failed"
                self._kill()
                raise BinlensError(
                    "timeout",
                    f"gdb did not answer within {timeout:g} s; the debug session was stopped",
                    details={"provider": "gdb", "reason": "timeout", "timeout_ms": int(timeout * 1000)},
                )
            payload = record.get("payload") if isinstance(record.get("payload"), dict) else {}
            if record.get("message") == "error":
                message = str((payload or {}).get("msg", "gdb refused the command"))[:500]
                raise BinlensError("invalid_argument", f"gdb: {message}", details={"provider": "gdb"})
            return payload or {}
        finally:
            self._cmd_lock.release()

    def check_alive(self) -> None:
        """The target is the pinned process and can be acted on (process_exited, process_changed, conflict)."""
        if self.state == "exited":
            raise process_exited_error(self.identity.pid if self.identity else 0)
        if self.state in ("detached", "closed", "failed", "idle"):
            raise BinlensError(
                "conflict", f"the debug session is {self.state}", details={"state": self.state, "provider": "gdb"}
            )
        if self.identity is not None:
            self.identity.check()

    def _gone(self) -> BinlensError:
        if self.state == "exited":  # (gdb is closed once its target exited: the exit is the answer)
            return process_exited_error(self.identity.pid if self.identity else 0)
        if self.state in ("detached", "closed"):
            return BinlensError("conflict", f"the debug session is {self.state}", details={"state": self.state})
        self.state = "failed"
        return BinlensError("internal", "gdb exited", details={"provider": "gdb", "reason": "crashed"})

    def require_stopped(self) -> None:
        """Refuse (conflict) unless the target is stopped."""
        if self.state != "stopped":
            self.check_alive()
            raise BinlensError(
                "conflict",
                f"the target is {self.state}; interrupt it or wait for a stop first",
                details={"state": self.state},
            )

    # --- events ---------------------------------------------------------------------------
    def _read_loop(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line or line.startswith("(gdb)"):
                continue
            try:
                record = parse_record(line)
            except Exception:  # noqa: BLE001 - a line the parser does not know is skipped
                log.debug("gdb: unparsed MI line %r", line[:200])
                continue
            kind, message = record.get("type"), record.get("message")
            with self._cond:
                if kind == "result" and record.get("token") is not None:
                    self._results[int(record["token"])] = record
                    if message == "running":
                        self.state = "running"
                elif kind == "notify" and message == "running":
                    self.state = "running"
                elif kind == "notify" and message == "stopped":
                    self._stopped(record.get("payload") or {})
                elif kind == "console" and self._console is not None and len(self._console) < 100000:
                    self._console.append(str(record.get("payload") or ""))
                self._cond.notify_all()
            if self._unheard:
                self._hear()
        with self._cond:
            if self.state in ("stopped", "running", "idle"):
                self.state = "failed"
            self._cond.notify_all()

    def _hear(self) -> None:
        """Give the listener the stop events it has not heard (outside the lock, after the callers
        waiting for them were woken: a server's push never delays an answer)."""
        with self._cond:
            unheard, self._unheard = self._unheard, []
        listener = self.listener
        if listener is None:
            return
        for event in unheard:
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - a listener's failure never stops the reader
                log.exception("debug event listener failed")

    def _stopped(self, payload: dict[str, Any]) -> None:
        """Turn a *stopped record into an event (under the condition's lock)."""
        reason = str(payload.get("reason") or "")
        frame: dict[str, Any] = payload["frame"] if isinstance(payload.get("frame"), dict) else {}
        event: dict[str, Any] = {"reason": reason or None, "time": round(time.time(), 6)}
        if reason in _EXIT_KINDS:
            event["kind"] = "exited"
            code = payload.get("exit-code")
            self.exit_code = (
                int(code, 8)
                if isinstance(code, str) and code.isdigit()
                else (0 if reason == "exited-normally" else None)
            )
            event["exit_code"] = self.exit_code
            if payload.get("signal-name"):
                event["signal"] = {"name": payload.get("signal-name"), "meaning": payload.get("signal-meaning")}
            self.state = "exited"
        else:
            self.state = "stopped"
            if reason == "breakpoint-hit":
                event["kind"] = "breakpoint"
                event["breakpoint"] = _int(payload.get("bkptno"))
            elif reason in _WATCH_REASONS:
                event["kind"] = "watchpoint"
                wpt = payload.get("wpt") or payload.get("hw-awpt") or payload.get("hw-rwpt") or {}
                value: dict[str, Any] = payload["value"] if isinstance(payload.get("value"), dict) else {}
                event["watchpoint"] = {
                    "id": _int(wpt.get("number") if isinstance(wpt, dict) else payload.get("wpnum")),
                    "expression": wpt.get("exp") if isinstance(wpt, dict) else None,
                    "old": value.get("old"),
                    "new": value.get("new") or value.get("value"),
                }
            elif reason == "signal-received" and payload.get("signal-name") not in (None, "0"):
                event["kind"] = "signal"
                event["signal"] = {"name": payload.get("signal-name"), "meaning": payload.get("signal-meaning")}
            elif reason in _STEP_REASONS or (not reason and self._resumed_by in _STEP_COMMANDS):
                event["kind"] = "step"
                if reason == "function-finished" and "return-value" in payload:
                    event["return_value"] = str(payload["return-value"])[:200]
            else:
                event["kind"] = "stopped"
            event["thread"] = _int(payload.get("thread-id"))
            address = _int(frame.get("addr"), 16)
            event["address"] = address
            event["gdb_function"] = frame.get("func") if frame.get("func") not in (None, "??") else None
        self._seq += 1
        event["seq"] = self._seq
        self._events.append(event)
        self.last_stop = event
        self._unheard.append(event)  # (the listener hears it once the waiting caller is woken)

    def events(self, after: int, limit: int) -> tuple[list[dict[str, Any]], int, int]:
        """Events with seq > `after` (at most `limit`), the seq of the last one given (or `after`),
        and the first seq still in the log."""
        with self._cond:
            items = [e for e in self._events if e["seq"] > after][:limit]
            first = self._events[0]["seq"] if self._events else self._seq + 1
        return items, (items[-1]["seq"] if items else after), first

    @property
    def seq(self) -> int:
        """The seq of the newest event (0 before any)."""
        return self._seq

    def wait_event(
        self, after: int, timeout: float, cancelled: Callable[[], bool] | None = None
    ) -> dict[str, Any] | None:
        """The first event with seq > `after`, waiting at most `timeout` seconds (None on timeout)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self._events:
                    if event["seq"] > after:
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or self.state in ("failed", "closed", "detached") or (cancelled and cancelled()):
                    return None
                self._cond.wait(min(left, 0.1))

    def wait_stop(self, timeout: float) -> dict[str, Any] | None:
        """Wait (bounded) until the target is not running; the last stop event, or None."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.state == "running" or (self.state == "idle" and self.last_stop is None):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.1))
            return self.last_stop

    def _drain_output(self) -> None:
        """Read the target's stdout and stderr (a FIFO) to its end, keeping the last 4 KiB."""
        try:
            with open(self._output, "rb", buffering=0) as f:
                while chunk := f.read(65536):
                    with self._cond:
                        self._tail = (self._tail + chunk)[-MAX_OUTPUT_TAIL:]
        except OSError:
            return

    def output_tail(self) -> str:
        """The end (4 KiB) of what the target wrote to stdout and stderr (targets gdb started)."""
        if self._final_output is not None:
            return self._final_output
        with self._cond:
            return self._tail.decode("utf-8", "replace")

    def mark_exited(self, reason: str) -> None:
        """Record an exit gdb does not report as a stop (a kill): the state and an `exited` event."""
        with self._cond:
            if self.state == "exited":
                return
            self._stopped({"reason": "exited-signalled", "signal-name": "SIGKILL", "signal-meaning": reason})
        self._hear()


def _int(value: Any, base: int = 10) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return int(value, base)
    except ValueError:
        return None


def _kill_all(proc: subprocess.Popen[bytes], targets: list[tuple[int, int]]) -> None:
    """Kill gdb's process group and the targets it started that still run (at close, on a timeout,
    at server exit); a pid that names another process by now is left alone."""
    for pid, start in targets:
        if process_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(CLOSE_WAIT_S)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
