"""The corpus tests' helpers: a real PostgreSQL server for the test run (`PostgresServer`), and a
corpus record built from a program the tests compiled (`record_of`).

The server is Debian's `postgresql` (scripts/system-packages.sh installs it for `test` and `ci`):
`initdb` in a temporary folder and `pg_ctl start` on 127.0.0.1 at a free port (and a unix socket in
that folder), fsync off; as root, both run as an existing unprivileged user (`postgres`, else
`nobody`) through `runuser`, the folder chowned to it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from binlens.corpus.records import BinaryRecord


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian's layout), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server in a temporary folder, started and stopped by the test run."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.folder = Path(tempfile.mkdtemp(prefix="binlens-pg-"))
        self.user: str | None = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pw = pwd.getpwnam(name)
                except KeyError:
                    continue
                self.user = name
                os.chown(self.folder, pw.pw_uid, pw.pw_gid)
                break
            else:
                raise RuntimeError("running as root with neither a `postgres` nor a `nobody` user to run PostgreSQL")
        os.chmod(self.folder, 0o700)
        self.port = _free_port()
        self.url = f"postgresql://binlens@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.folder, check=False)

    def start(self) -> None:
        """initdb and start the server; RuntimeError with its log when either fails."""
        data, log = self.folder / "data", self.folder / "server.log"
        r = self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "binlens",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        if r.returncode:
            raise RuntimeError(f"initdb failed: {r.stderr or r.stdout}")
        opts = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -F -c shared_buffers=32MB -c max_connections=60"
        r = self._run(
            str(self.bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"
        )
        if r.returncode:
            text = log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr or r.stdout}\n{text}")

    def database(self, name: str) -> str:
        """A new empty database `name` on the server; its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + "/" + name

    def stop(self) -> None:
        """Stop the server and delete its folder."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


def record_of(workspace: object, path: Path) -> BinaryRecord:
    """The corpus record of the program at `path` (`api/corpus.py: binary_record`)."""
    import time

    from binlens.api.corpus import binary_record
    from binlens.jobs.state import analysis_of

    t0 = time.monotonic()
    prog = workspace.open(path)  # type: ignore[attr-defined]
    view = analysis_of(prog).require(None, timeout_s=300)
    return binary_record(prog, view, time.monotonic() - t0)
