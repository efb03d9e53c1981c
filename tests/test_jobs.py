"""The full analysis runs in its own process: same result, progress, cancellation, kills, budget."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from binlens.api import CallContext, invoke


def _libc() -> Path:
    for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"), Path("/usr/lib64/libc.so.6")):
        if p.exists():
            return p
    pytest.skip("no system libc to analyse")


def _state(workspace, path):  # noqa: ANN001, ANN202
    from binlens.jobs.state import analysis_of

    return analysis_of(workspace.open(path, check_roots=False))


def _wait_running(st, fraction: float = 0.05, timeout: float = 60):  # noqa: ANN001, ANN202
    """Start the analysis and wait until its process has made some progress; the process."""
    st.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker = st.worker
        if worker is not None and st.fraction >= fraction:
            return worker
        assert st.status == "running", st.snapshot()
        time.sleep(0.005)
    raise AssertionError(f"no progress: {st.snapshot()}")


def _stored_rows(db) -> dict[str, int]:  # noqa: ANN001
    conn = db.connect()
    return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("analysis_run", "func", "xref_pack")}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("opt,pie", [("-O2", True), ("-O0", False)])
def test_same_result_as_in_process_and_progress_arrives(workspace, compile_c, opt, pie) -> None:  # noqa: ANN001
    from binlens.analysis import analyze
    from binlens.store.analysis import AnalysisView, unpack_xrefs

    prog = workspace.open(compile_c("sample.c", opt, pie, strip=True), check_roots=False)
    st = prog.extensions["analysis"]
    seen: list[tuple[float, float | None, str | None]] = []
    frames: list[tuple[str | None, int | None]] = []  # (message, pid of the process that sent it)
    relay = st._progress

    def from_process(done: float, total: float | None, message: str | None) -> None:
        worker = st.worker
        frames.append((message, worker.pid if worker is not None else None))
        relay(done, total, message)

    st._progress = from_process  # what the analysis process's frames arrive through

    def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    invoke(workspace, "analysis.start", {"wait": True}, CallContext(progress=progress))
    assert invoke(workspace, "analysis.get", {})["status"] == "done"
    assert seen[-1][:2] == (100, 100)  # the caller's progress ends at 100 % (polled: a fast run shows only that)
    pids = {pid for _m, pid in frames if pid is not None}
    assert pids and os.getpid() not in pids  # the frames came from another process
    assert "saving to the program database" in {m for m, _p in frames}

    want = analyze(prog.image)
    view = AnalysisView(prog.db)
    assert [(f.address, f.size, f.blocks, f.noreturn) for f in view.functions] == [
        (f.address, f.size, len(f.blocks), f.noreturn) for f in want.functions
    ]
    for f in want.functions:
        assert [b[:2] for b in view.blocks(f.address)] == [(b.start, b.end) for b in f.blocks]
        assert sorted(view.edges(f.address)) == sorted((e.src, e.dst, e.kind) for e in f.edges)
    rows = prog.db.connect().execute("SELECT data, kinds FROM xref_pack").fetchall()
    stored = sorted(x for data, kinds in rows for x in unpack_xrefs(data, kinds))
    assert stored == sorted((x.src, x.dst, x.kind) for x in want.xrefs)
    assert len(view.strings()) == len(want.strings)


def test_user_starts_reach_the_analysis_process(workspace, compile_c) -> None:  # noqa: ANN001
    from binlens.analysis import analyze
    from binlens.store.analysis import set_user_function

    prog = workspace.open(compile_c("sample.c", "-O2", True, strip=True), check_roots=False)
    base = analyze(prog.image)
    victim = base.functions[-1].address
    set_user_function(prog.db, victim, False)
    st = prog.extensions["analysis"]
    st.require(None, timeout_s=60)
    assert victim not in st.view.by_address
    assert len(st.view.functions) == len(analyze(prog.image, excluded_starts=[victim]).functions)


def test_cancel_kills_the_process_at_once(workspace) -> None:  # noqa: ANN001
    st = _state(workspace, _libc())
    worker = _wait_running(st)
    t0 = time.monotonic()
    st.cancel()
    assert st._done.wait(10)
    elapsed = time.monotonic() - t0
    assert st.status == "cancelled" and _gone(worker.pid)
    assert elapsed < 5, f"cancellation took {elapsed:.3f} s"  # a hang bound; the rows below show the kill
    assert _stored_rows(st.prog.db) == {"analysis_run": 0, "func": 0, "xref_pack": 0}


def test_call_cancellation_kills_the_process(workspace) -> None:  # noqa: ANN001
    st = _state(workspace, _libc())
    workers = []

    def progress(done: float, total: float | None, message: str | None) -> None:
        if st.worker is not None and done > 5:
            workers.append(st.worker)
            ctx.cancel()

    ctx = CallContext(progress=progress)
    from binlens.errors import BinlensError

    with pytest.raises(BinlensError) as err:
        invoke(workspace, "analysis.start", {"wait": True}, ctx)
    assert err.value.code == "cancelled"
    assert st._done.wait(10) and st.status == "cancelled"
    assert workers and _gone(workers[0].pid)


@pytest.mark.parametrize("phase", ["analysing", "saving"])
def test_sigkill_gives_failed_and_no_partial_analysis(workspace, phase: str) -> None:  # noqa: ANN001
    st = _state(workspace, _libc())
    worker = _wait_running(st, 0.3)
    if phase == "saving":
        deadline = time.monotonic() + 60
        while not st.message.startswith("saving") and time.monotonic() < deadline:
            assert st.status == "running", st.snapshot()
            time.sleep(0.002)
        assert st.message.startswith("saving"), st.snapshot()
        time.sleep(0.05)  # well inside the save's transaction (~0.5 s for libc)
    os.kill(worker.pid, signal.SIGKILL)
    assert st._done.wait(10)
    rows = _stored_rows(st.prog.db)
    if phase == "saving" and st.status == "done":
        # the kill landed after the save's commit (a fast save): the whole run is stored, and said so
        assert rows["analysis_run"] == 1 and rows["func"] == len(st.view.functions) > 1000, rows
        assert invoke(workspace, "analysis.get", {})["status"] == "done"
        return
    assert st.status == "failed", st.snapshot()
    assert "SIGKILL" in st.error and "nothing was saved" in st.error
    got = invoke(workspace, "analysis.get", {})
    assert got["status"] == "failed" and "SIGKILL" in got["error"]
    assert rows == {"analysis_run": 0, "func": 0, "xref_pack": 0}
    if phase == "saving":  # the database is fine: a new run completes
        invoke(workspace, "analysis.start", {"wait": True, "timeout_ms": 120000})
        assert st.status == "done" and _stored_rows(st.prog.db)["func"] > 1000


def test_time_budget_kills_the_process(workspace) -> None:  # noqa: ANN001
    st = _state(workspace, _libc())
    st.budget_s = 0.3
    st.start()
    assert st._done.wait(10)
    assert st.status == "failed" and "longer than 0.3 s" in st.error
    assert _stored_rows(st.prog.db)["func"] == 0


def test_file_changed_on_disk_is_analysed_from_the_opened_bytes(workspace, compile_c, tmp_path) -> None:  # noqa: ANN001
    copy = tmp_path / "prog"
    shutil.copy(compile_c("sample.c", "-O2", True, strip=True), copy)
    st = _state(workspace, copy)
    copy.write_bytes(b"\x7fELF changed")
    view = st.require(None, timeout_s=60)
    assert st.status == "done" and len(view.functions) >= 16


def _run_watching_pids(st) -> set[int]:  # noqa: ANN001
    """Run the program's analysis to its end; the ids of the processes that ran it."""
    from binlens.jobs import client

    pids = set()
    real_run = client.AnalysisProcess.run

    def run(self, *args):  # noqa: ANN001, ANN002, ANN202 - records which process each run uses
        pids.add(self.pid)
        return real_run(self, *args)

    client.AnalysisProcess.run = run
    try:
        st.start()
        assert st._done.wait(60)
    finally:
        client.AnalysisProcess.run = real_run
    return pids


def test_early_start_is_taken_over_and_saves_only_then(workspace, compile_c, home) -> None:  # noqa: ANN001
    from binlens.analysis import analyze
    from binlens.jobs import client

    path = compile_c("sample.c", "-O2", True, strip=True)
    client.prestart(str(path), None, str(home))
    early = client._spare
    assert early is not None
    time.sleep(0.5)  # it analyses meanwhile, but saves nothing before the caller takes it over
    prog = workspace.open(path, check_roots=False)
    assert _stored_rows(prog.db)["func"] == 0
    st = prog.extensions["analysis"]
    assert _run_watching_pids(st) == {early.pid} and st.status == "done"
    assert [f.address for f in st.view.functions] == [f.address for f in analyze(prog.image).functions]


def test_early_start_whose_user_starts_changed_analyses_again(workspace, compile_c, home) -> None:  # noqa: ANN001
    """The early process analysed with no user starts; the caller's request has one removed: the
    process analyses again with it (the request carries no image: it parses its own bytes)."""
    from binlens.analysis import analyze
    from binlens.jobs import client
    from binlens.store.analysis import set_user_function

    path = compile_c("sample.c", "-O2", True, strip=True)
    client.prestart(str(path), None, str(home))
    early = client._spare
    time.sleep(0.5)
    prog = workspace.open(path, check_roots=False)
    whole = analyze(prog.image).functions
    gone = next(f.address for f in whole if "call" in f.sources and f.address != prog.image.identity.entry)
    set_user_function(prog.db, gone, False)
    st = prog.extensions["analysis"]
    assert _run_watching_pids(st) == {early.pid} and st.status == "done"
    want = analyze(prog.image, excluded_starts=[gone]).functions
    assert [f.address for f in st.view.functions] == [f.address for f in want]
    assert gone not in {f.address for f in st.view.functions}


def test_early_start_not_needed_exits_without_saving(home, compile_c) -> None:  # noqa: ANN001
    from binlens.jobs import client
    from binlens.store import ProgramDatabase, database_path
    from binlens.store.analysis import load_run

    path = compile_c("sample.c", "-O0", True, strip=True)
    client.prestart(str(path), None, str(home))
    proc = client._spare
    client._spare = None
    time.sleep(0.5)
    proc.stdin.close()  # the caller ends without needing the analysis
    assert proc.wait(10) == 0
    import hashlib

    db = ProgramDatabase(database_path(home, hashlib.sha256(path.read_bytes()).hexdigest()))
    assert load_run(db) is None


def test_cli_functions_with_the_early_analysis(home, compile_c) -> None:  # noqa: ANN001
    import json

    from binlens.analysis import analyze
    from binlens.loader import load_image
    from conftest import run_cli

    path = compile_c("sample.c", "-O2", False, strip=True)
    out = run_cli("functions", str(path), "--json", home=home)
    assert out.returncode == 0, out.stderr
    got = [int(f["address"], 16) for f in json.loads(out.stdout)["functions"]]
    assert got == [f.address for f in analyze(load_image(str(path))).functions]
    assert "analysing: 100%" in out.stderr
    again = run_cli("functions", str(path), "--json", home=home)  # from the database; the early process is idle
    assert again.returncode == 0 and json.loads(again.stdout)["functions"] == json.loads(out.stdout)["functions"]


def test_an_early_start_that_failed_is_replaced(workspace, compile_c, home, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from binlens.jobs import client

    copy = tmp_path / "prog"
    monkeypatch.setattr(client, "_fast_format", lambda path: True)  # start early though it is absent
    client.prestart(str(copy), None, str(home))  # the file is not there yet: it fails and exits
    early = client._spare
    assert early.wait(10) == 0
    shutil.copy(compile_c("sample.c", "-O2", True, strip=True), copy)
    st = _state(workspace, copy)
    st.require(None, timeout_s=60)  # the exited early process is not taken: a fresh one does the work
    assert st.status == "done" and len(st.view.functions) >= 16


def test_the_callers_parsed_image_is_used_not_parsed_again(workspace, compile_c, tmp_path) -> None:  # noqa: ANN001
    """The request carries the image the caller parsed (`encode_image`): the analysis process decodes
    it instead of parsing the file again (so PE and Mach-O do not import LIEF twice). Shown by handing
    it an image whose symbols were removed: the saved functions then have no symbol names, which a
    fresh parse of the (unstripped) file would give them."""
    import dataclasses

    from binlens.jobs.client import AnalysisProcess
    from binlens.jobs.request import AnalysisRequest
    from binlens.loader.image import encode_image
    from binlens.store import ProgramDatabase
    from binlens.store.analysis import AnalysisView

    path = compile_c("sample.c", "-O2", True)  # unstripped: a reparse names the functions
    prog = workspace.open(path, check_roots=False)
    assert any(s.kind == "function" for s in prog.image.symbols)
    blind = dataclasses.replace(prog.image, symbols=[], exports=[])
    db_path = tmp_path / "blind.db"
    ProgramDatabase(db_path).connect()  # created and migrated, as the caller does
    ident = prog.image.identity
    request = AnalysisRequest(str(path), ident.sha256, str(db_path), ident.slice, image=encode_image(blind))
    saved = AnalysisProcess(request).run(lambda *_a: None, threading.Event(), 120)
    view = AnalysisView(ProgramDatabase(db_path))
    assert saved == len(view.functions) > 0
    assert all(f.symbol is None for f in view.functions)
    # the same request without the image parses the file and finds the names
    db2 = tmp_path / "named.db"
    ProgramDatabase(db2).connect()
    AnalysisProcess(dataclasses.replace(request, image=None, db_path=str(db2))).run(
        lambda *_a: None, threading.Event(), 120
    )
    assert any(f.symbol for f in AnalysisView(ProgramDatabase(db2)).functions)


def test_only_fast_reader_formats_start_early(home, tmp_path) -> None:  # noqa: ANN001
    """The CLI's early start is for x86/x86-64 ELF only: another format would make the early process
    import LIEF beside the parser worker; its request comes later, with the parsed image."""
    from binlens.jobs import client

    pe = tmp_path / "prog.exe"
    pe.write_bytes(b"MZ" + bytes(200))
    client.prestart(str(pe), None, str(home))
    spare = client._spare
    assert client._spare_key is None and spare.poll() is None  # warm, idle, not analysing
    client._drop_spare()
    elf = tmp_path / "prog"
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00\x3e\x00" + bytes(44))
    client.prestart(str(elf), None, str(home))
    assert client._spare_key == (os.path.realpath(elf), None)
    client._drop_spare()


def _dump(db_path: Path) -> dict:
    """Every analysis row of a program database (the run without its time and duration)."""
    import sqlite3

    conn = sqlite3.connect(db_path)
    try:
        tables = ("func", "func_blocks", "call", "xref_pack", "string")
        out = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}  # noqa: S608
        run = "engine, status, functions, blocks, instructions, xrefs, strings, code_bytes, covered_bytes"
        out["analysis_run"] = conn.execute(f"SELECT {run} FROM analysis_run").fetchall()  # noqa: S608
        return out
    finally:
        conn.close()


def test_two_process_analysis_stores_what_the_in_process_save_stores(compile_c, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The analysis process builds the functions in a forked child beside the references (two
    CPUs); with BINLENS_SERIAL=1 it does all in one process. Both store what `save_analysis` of
    the in-process analysis stores."""
    from binlens.analysis import analyze
    from binlens.jobs import client, fork
    from binlens.jobs.request import AnalysisRequest
    from binlens.loader.parse_lief import parse_path
    from binlens.store import ProgramDatabase
    from binlens.store.analysis_save import save_analysis

    if not fork.parallel():
        pytest.skip("one CPU (or no fork): the analysis process never forks here")
    libc = [p for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"), Path("/usr/lib64/libc.so.6")) if p.exists()]
    for path in (compile_c("sample.c", "-O2", True, strip=True), *libc[:1]):
        image = parse_path(str(path))
        expected = tmp_path / f"{path.name}-in-process.sqlite"
        db = ProgramDatabase(expected)
        save_analysis(db, analyze(image))
        db.close()
        want = _dump(expected)
        assert want["func"] and want["xref_pack"] and want["string"]
        for serial in ("0", "1"):
            monkeypatch.setenv("BINLENS_SERIAL", serial)
            client._drop_spare()  # (a spare would have started with the other setting)
            target = tmp_path / f"{path.name}-{serial}.sqlite"
            request = AnalysisRequest(str(path), image.identity.sha256, str(target))
            n = client.AnalysisProcess(request).run(lambda *_: None, threading.Event(), 300)
            assert n == len(want["func"])
            assert _dump(target) == want, f"{path.name} serial={serial}"


@pytest.mark.parametrize("serial", ["0", "1"])
def test_the_engine_state_is_gone_before_the_references_rows(compile_c, monkeypatch, serial: str) -> None:  # noqa: ANN001
    """Once the functions' rows are built, the engine's state is let go (the references' rows and
    the save then use its memory): nothing of it is alive when the references' rows are made, and
    the rows are whole."""
    import weakref

    from binlens.analysis import engine
    from binlens.jobs.rows import analyse
    from binlens.loader.parse_lief import parse_path
    from binlens.store import analysis_save

    monkeypatch.setenv("BINLENS_SERIAL", serial)
    image = parse_path(str(compile_c("sample.c", "-O2", True, strip=True)))
    seen: dict[str, object] = {}
    real_explore, real_rows = engine.explore, analysis_save.reference_rows

    def explore(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        explored = real_explore(*args, **kwargs)
        seen["explored"] = weakref.ref(explored)
        seen["explorer"] = weakref.ref(explored.reader.explorer)
        return explored

    def reference_rows(*args):  # noqa: ANN002, ANN202
        seen["alive"] = [k for k in ("explored", "explorer") if seen[k]() is not None]  # type: ignore[operator]
        return real_rows(*args)

    monkeypatch.setattr(engine, "explore", explore)
    monkeypatch.setattr(analysis_save, "reference_rows", reference_rows)
    rows = analyse(image, lambda *_: None, [], [])
    assert seen["alive"] == []
    assert rows.functions.counts[0] > 5 and rows.references.counts[0] > 0
    assert rows.figures[1] > 0 and 0 < rows.figures[2] <= rows.figures[1]  # code bytes, covered bytes


def test_without_a_temporary_file_the_child_rows_come_through_the_pipe(compile_c, monkeypatch) -> None:  # noqa: ANN001
    """The forked child spools its rows to a temporary file; where none can be made (no writable
    temporary directory), they come through the pipe as before: the same rows either way."""
    import tempfile

    from binlens.jobs import fork
    from binlens.jobs.rows import analyse
    from binlens.loader.parse_lief import parse_path

    if not fork.parallel():
        pytest.skip("one CPU (or no fork): the analysis process never forks here")
    image = parse_path(str(compile_c("sample.c", "-O2", True, strip=True)))

    def rows_of(result):  # noqa: ANN001, ANN202
        parts = [(func, blocks, list(calls)) for func, blocks, calls in result.functions.parts()]
        func = sorted(r for p in parts for r in p[0])
        return func, sorted(r for p in parts for r in p[1]), sorted(c for p in parts for c in p[2]), result.references

    spooled = analyse(image, lambda *_: None, [], [])
    assert spooled.functions.spooled > 0 and spooled.functions.spool is not None

    def no_file(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_file)
    piped = analyse(image, lambda *_: None, [], [])
    assert piped.functions.spooled == 0 and piped.functions.spool is None
    assert rows_of(piped) == rows_of(spooled) and piped.functions.counts == spooled.functions.counts


def test_a_dead_function_builder_is_a_clean_error(compile_c, monkeypatch) -> None:  # noqa: ANN001
    """The forked child that builds functions dies: the analysis fails with a clear message."""
    from binlens.errors import BinlensError
    from binlens.jobs import fork
    from binlens.jobs.rows import analyse
    from binlens.loader.parse_lief import parse_path
    from binlens.store import analysis_save as store

    if not fork.parallel():
        pytest.skip("one CPU (or no fork): the analysis process never forks here")
    image = parse_path(str(compile_c("sample.c", "-O2", True, strip=True)))
    parent = os.getpid()
    real = store.function_rows

    def dying(functions, spans=None):  # noqa: ANN001, ANN202 - the child ends at once, as a crash would
        if os.getpid() != parent:
            os._exit(3)
        return real(functions, spans)

    monkeypatch.setattr(store, "function_rows", dying)
    with pytest.raises(BinlensError) as err:
        analyse(image, lambda *_: None, [], [])
    assert err.value.code == "internal"
    assert err.value.message == "the analysis failed: its function builder stopped (exit status 3)"


def test_a_full_disk_for_the_child_rows_is_a_clean_error(compile_c, monkeypatch) -> None:  # noqa: ANN001
    """The child cannot write its rows to the temporary file (its disk is full): the analysis
    fails with the reason."""
    from binlens.errors import BinlensError
    from binlens.jobs import fork
    from binlens.jobs.rows import analyse
    from binlens.loader.parse_lief import parse_path
    from binlens.store import analysis_save as store

    if not fork.parallel():
        pytest.skip("one CPU (or no fork): the analysis process never forks here")
    image = parse_path(str(compile_c("sample.c", "-O2", True, strip=True)))

    real = store.streamed_function_rows

    def full(functions, batch=512, spool=None):  # noqa: ANN001, ANN202
        if spool is None:  # (this process's own functions)
            return real(functions, batch)
        next(iter(functions))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "streamed_function_rows", full)
    with pytest.raises(BinlensError) as err:
        analyse(image, lambda *_: None, [], [])
    assert err.value.code == "internal"
    assert err.value.message == (
        "the analysis failed: its function builder could not write its rows: [Errno 28] No space left on device"
    )


def test_a_command_can_wait_for_its_analysis_processes_to_end(compile_c, tmp_path) -> None:  # noqa: ANN001
    """After "done" the process still folds the write-ahead log into the database; a one-shot
    command waits for it (`wait_for_processes`) so that nothing of it outlives the command."""
    from binlens.jobs import client
    from binlens.jobs.request import AnalysisRequest
    from binlens.loader.parse_lief import parse_path

    path = compile_c("sample.c", "-O2", True, strip=True)
    sha256 = parse_path(str(path)).identity.sha256
    request = AnalysisRequest(str(path), sha256, str(tmp_path / "p.sqlite"))
    worker = client.AnalysisProcess(request)
    assert worker.run(lambda *_: None, threading.Event(), 300) > 0
    client.wait_for_processes()
    assert worker.proc.poll() == 0 and not client._running
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.sqlite"]  # its log folded in and removed


@pytest.mark.parametrize(
    "name",
    [
        "elf/libarm.so",
        "elf/armeb_hello_static",
        "elf/mips-mozi",
        "elf/ip-riscv",
        "mach0/swift-main",
        "jmptbl/test_msvc_1900_32.exe",
    ],
)
def test_two_process_analysis_of_other_formats_and_architectures(name: str, tmp_path) -> None:  # noqa: ANN001
    """The forked split stores what the in-process save stores on ARM, MIPS, RISC-V, Mach-O and PE."""
    from binlens.analysis import analyze
    from binlens.jobs import client
    from binlens.jobs.request import AnalysisRequest
    from binlens.loader.parse_lief import parse_path
    from binlens.store import ProgramDatabase
    from binlens.store.analysis_save import save_analysis
    from conftest import corpus_dir

    path = corpus_dir() / name
    image = parse_path(str(path))
    db = ProgramDatabase(tmp_path / "in-process.sqlite")
    save_analysis(db, analyze(image))
    db.close()
    request = AnalysisRequest(str(path), image.identity.sha256, str(tmp_path / "worker.sqlite"))
    assert client.AnalysisProcess(request).run(lambda *_: None, threading.Event(), 300) > 0
    client.wait_for_processes()
    assert _dump(tmp_path / "worker.sqlite") == _dump(tmp_path / "in-process.sqlite")


def test_no_fork_when_the_machine_lacks_memory_for_the_child(tmp_path) -> None:  # noqa: ANN001
    from binlens.jobs import fork

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemAvailable:       1000 kB\n")  # 1 MB: less than this process
    assert fork.memory_allows_fork(str(meminfo)) is False
    meminfo.write_text("MemTotal:       1 kB\nMemAvailable:   1000000000 kB\n")
    assert fork.memory_allows_fork(str(meminfo)) is True
    assert fork.memory_allows_fork(str(tmp_path / "absent")) is True  # no /proc: fork


def test_the_analysis_process_does_not_load_openssl(compile_c, tmp_path) -> None:  # noqa: ANN001
    """`hashlib` maps OpenSSL's libcrypto (3.8 MiB resident): the analysis process, which only checks
    its bytes' digest, runs a whole analysis and save without it, and its digest is hashlib's."""
    import hashlib
    import subprocess
    import sys

    from binlens.loader.digest import sha256_hex

    for data in (b"", b"abc", os.urandom(100_003)):
        assert sha256_hex(data) == hashlib.sha256(data).hexdigest()
    path = compile_c("sample.c", "-O2", True, strip=True)
    script = (
        "import sys\n"
        "from binlens.jobs import child as w\n"
        "sent = []\n"
        f"req = w.AnalysisRequest({str(path)!r}, '', {str(tmp_path / 'db.sqlite')!r})\n"
        "w.analyse_and_save(req, sent.append)\n"
        "assert sent[-1][0] == 'done', sent[-1]\n"
        "print(sorted(m for m in ('hashlib', '_hashlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_frame_read_from_the_stream_is_whole_or_an_eof() -> None:
    """`load_frame` (the child's rows, unpickled from the pipe) gives the object written, and a
    frame cut short, as a dying writer leaves it, is an EOFError like a missing one."""
    import io

    from binlens.frames import load_frame, write_frame

    rows = [(i, i * 16, "x" * (i % 7)) for i in range(50_000)]
    buf = io.BytesIO()
    write_frame(buf, rows)
    whole = buf.getvalue()
    assert load_frame(io.BufferedReader(io.BytesIO(whole))) == rows
    for cut in (0, 4, len(whole) // 2, len(whole) - 1):
        with pytest.raises(EOFError):
            load_frame(io.BufferedReader(io.BytesIO(whole[:cut])))
