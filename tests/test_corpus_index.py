"""`binlens corpus index`: discovery by magic, indexing on a real local Ray (one per test run, two
CPUs, shared by the tests), resumption after a killed run, per-file failures, and a search across
optimisation levels."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import CORPUS, ROOT

ray = pytest.importorskip("ray", reason="the corpus extra (Ray) is not installed")


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray for the whole test run (two CPUs, no dashboard): its GCS address."""
    os.environ["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 << 20,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def binaries(compile_c: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder of compiled binaries with a duplicate copy, a non-binary file, a nested folder and
    a symbolic link back up the tree; the distinct binaries by name."""
    top = tmp_path_factory.mktemp("bins")
    (top / "nested").mkdir()
    built = {
        "sample-O2": compile_c("sample.c", "-O2"),
        "sample-O3": compile_c("sample.c", "-O3"),
        "strings-O2": compile_c("strings.c", "-O2"),
        "gotos-O2": compile_c("gotos.c", "-O2"),
        "callbacks-O0": compile_c("callbacks.c", "-O0"),
    }
    out = {}
    for i, (name, path) in enumerate(built.items()):
        dest = (top / "nested" if i % 2 else top) / name
        shutil.copyfile(path, dest)
        out[name] = dest
    shutil.copyfile(built["sample-O2"], top / "nested" / "sample-O2-copy")
    (top / "README.txt").write_text("not a binary\n")
    (top / "nested" / "up").symlink_to("..")
    return out


def _store(home: Path, url: str | None = None) -> Any:
    from binlens.corpus.store import open_store

    return open_store(url, home)


def _index(paths: list[Path], home: Path, corpus: str = "t", store: Any = None, **kw: Any) -> Any:
    from binlens.corpus.index import IndexOptions, index

    store = store or _store(home)
    return index(IndexOptions(corpus, [str(p) for p in paths], home, workers=2, **kw), store)


def _cli(*args: str, home: Path, **kw: Any) -> subprocess.Popen[str]:
    env = dict(os.environ, BINLENS_HOME=str(home))
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "binlens", "corpus", "index", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


# ----------------------------------------------------------------------------------- discovery
def test_discovery_by_magic_deduplicated_without_looping(binaries: dict[str, Path], tmp_path: Path) -> None:
    from binlens.corpus.discover import discover, executable_format

    top = binaries["sample-O2"].parent
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a FIFO is not read (opening one for reading would block)
    found = discover([top, fifo])
    assert sorted(Path(c.path).name for c in found.files) == sorted(binaries)
    assert {Path(p).name for p in found.duplicates} == {"sample-O2-copy"}
    assert found.other == 2 and found.looped == 1 and not found.failures  # (README.txt and the FIFO)
    # PE needs its `PE\0\0` header where e_lfanew points; a Java class file is not a fat Mach-O
    pe = bytearray(0x200)
    pe[:2], pe[0x3C:0x40], pe[0x80:0x84] = b"MZ", (0x80).to_bytes(4, "little"), b"PE\0\0"
    assert executable_format(bytes(pe)) == "pe"
    assert executable_format(b"MZ" + bytes(0x100)) is None
    assert executable_format(b"\xca\xfe\xba\xbe\x00\x00\x00\x34") is None
    assert executable_format(b"\xca\xfe\xba\xbe\x00\x00\x00\x02") == "macho"
    assert executable_format(b"\xcf\xfa\xed\xfe" + bytes(28)) == "macho"


def test_discovery_reports_unreadable_files(binaries: dict[str, Path], tmp_path: Path) -> None:
    from binlens.corpus.discover import discover

    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        shutil.copyfile(binaries["sample-O2"], locked)
        locked.chmod(0)
        found = discover([tmp_path])
        assert [f.path for f in found.failures] == [str(locked)] and found.failures[0].sha256 is None
        return
    # root reads any file: discover as `nobody`, in a forked child, over a folder it may list
    import json
    import pwd
    import tempfile

    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="binlens-unreadable-"))
    try:
        top.chmod(0o755)
        locked = top / "locked"
        shutil.copyfile(binaries["sample-O2"], locked)
        locked.chmod(0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 1
            try:
                os.close(r)
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                failures = [[f.path, f.sha256] for f in discover([top]).failures]
                os.write(w, json.dumps(failures).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as pipe:
            data = pipe.read()
        assert os.waitpid(pid, 0)[1] == 0
        assert json.loads(data) == [[str(locked), None]]
    finally:
        shutil.rmtree(top)


def test_a_worker_record_equals_the_served_programs(
    compile_c: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An indexing worker hands the store what `binary_record` builds for a served program,
    the tail jumps of the inlining context included."""
    # (a worker sets BINLENS_SERIAL for its process: here that is the test run's, restored after)
    monkeypatch.setenv("BINLENS_SERIAL", "1")
    from binlens.api import REGISTRY  # noqa: F401 - registers the domains
    from binlens.corpus.worker import index_file
    from binlens.loader.digest import sha256_hex
    from binlens.workspace import Config, Workspace
    from corpus_support import record_of

    binary = compile_c("inline_ctx.c", opt="-O2")
    worker = index_file(str(binary), sha256_hex(binary.read_bytes()), str(tmp_path / "w"), 1 << 30)
    served = record_of(Workspace(Config(home=tmp_path / "s")), binary)
    assert worker.tail_calls and dict(worker.tail_calls) == dict(served.tail_calls)
    assert [f.exact for f in worker.functions] == [f.exact for f in served.functions]
    assert sorted(worker.imports) == sorted(served.imports)


# ------------------------------------------------------------------------------------ indexing
def test_index_counts_then_nothing_the_second_time(ray_address: str, binaries: dict[str, Path], home: Path) -> None:
    top = binaries["sample-O2"].parent
    first = _index([top], home)
    assert (first.found, first.duplicates, first.other_files) == (len(binaries), 1, 1)
    assert first.indexed == len(binaries) and first.skipped == 0 and not first.failed
    assert first.functions > 0
    store = _store(home)
    assert len(store.indexed("t")) == len(binaries)
    second = _index([top], home)
    assert second.indexed == 0 and second.skipped == len(binaries) and not second.failed
    assert len(_store(home).indexed("t")) == len(binaries)


def test_a_failing_file_is_reported_and_the_run_completes(
    ray_address: str, binaries: dict[str, Path], home: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "truncated.elf").write_bytes(binaries["sample-O2"].read_bytes()[:40])  # shorter than its header
    shutil.copyfile(binaries["gotos-O2"], bad / "good")
    crashers = sorted((CORPUS / "fuzzed").glob("*"))[:6] if (CORPUS / "fuzzed").is_dir() else []
    report = _index([bad, *crashers], home, corpus="bad")
    failed = {Path(f.path).name: f for f in report.failed}
    assert "truncated.elf" in failed and failed["truncated.elf"].code == "invalid_argument"
    assert "truncated" in failed["truncated.elf"].message
    assert "good" not in failed and report.indexed >= 1
    assert report.indexed + len(report.failed) == report.found  # every file answered: none stopped the run


def test_a_file_past_its_time_budget_is_killed_and_reported(
    ray_address: str, binaries: dict[str, Path], home: Path, tmp_path: Path
) -> None:
    one = tmp_path / "one"
    one.mkdir()
    shutil.copyfile("/usr/bin/ls" if Path("/usr/bin/ls").is_file() else binaries["gotos-O2"], one / "ls")
    report = _index([one], home, corpus="slow", timeout_s=0.05)
    assert report.indexed == 0 and [f.code for f in report.failed] == ["timeout"]
    assert "0.05 s" in report.failed[0].message
    # the killed worker is replaced: the same file indexes within a sound budget afterwards
    again = _index([one], home, corpus="slow")
    assert again.indexed == 1 and not again.failed


def _kill_midway_and_rerun(
    binaries: dict[str, Path], home: Path, tmp_path: Path, address: str, url: str | None
) -> None:
    """SIGKILL `binlens corpus index` once some binaries are stored, rerun it: every binary is in
    the corpus once."""
    many = tmp_path / "many"
    many.mkdir()
    for p in binaries.values():
        (many / p.name).symlink_to(p)
    system = [p for p in sorted(Path("/usr/bin").glob("*")) if p.is_file() and not p.is_symlink()]
    picked = 0
    for p in system:
        if 20_000 < p.stat().st_size < 200_000 and p.read_bytes()[:4] == b"\x7fELF":
            (many / p.name).symlink_to(p)
            picked += 1
            if picked == 24:
                break
    from binlens.corpus.discover import discover

    expected = {c.sha256 for c in discover([many]).files}
    args = [str(many), "--corpus", "k", "--ray-address", address, "--json"] + (["--store", url] if url else [])
    proc = _cli(*args, home=home)
    store = _store(home, url)
    deadline = time.monotonic() + 300
    while not store.indexed("k"):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "nothing was indexed in 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    partial = store.indexed("k")
    assert 0 < len(partial) < len(expected), "the run ended before it could be killed midway"
    rerun = _cli(*args, home=home)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    report = json.loads(out)
    assert report["skipped"] >= len(partial) and not report["failed"]
    assert report["indexed"] + report["skipped"] == len(expected)
    assert _store(home, url).indexed("k") == expected
    info = _store(home, url).info("k")
    assert info.binaries == len(expected)


def test_killed_run_resumes_sqlite(ray_address: str, binaries: dict[str, Path], home: Path, tmp_path: Path) -> None:
    _kill_midway_and_rerun(binaries, home, tmp_path, ray_address, None)


def test_killed_run_resumes_postgresql(
    ray_address: str, binaries: dict[str, Path], home: Path, tmp_path: Path, postgres_server: Any
) -> None:
    url = postgres_server.database("k" + os.urandom(6).hex())
    _kill_midway_and_rerun(binaries, home, tmp_path, ray_address, url)


def test_cli_progress_and_summary(ray_address: str, binaries: dict[str, Path], home: Path) -> None:
    top = binaries["sample-O2"].parent
    proc = _cli(
        str(binaries["strings-O2"]), str(top / "README.txt"), "--corpus", "c", "--ray-address", ray_address, home=home
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "1 indexed, 0 skipped (already indexed), 0 failed" in out and "files/s" in out
    assert "discovering" in err and "done: 1 indexed" in err  # plain lines when stderr is a pipe
    proc = _cli(str(top), "--corpus", "c", "--ray-address", ray_address, "--json", home=home)
    out, _ = proc.communicate(timeout=600)
    report = json.loads(out)
    assert report["skipped"] == 1 and report["indexed"] == len(binaries) - 1 and report["failed"] == []


# -------------------------------------------------------------------------------------- search
def test_a_function_of_an_o2_build_is_found_in_the_o3_build(
    ray_address: str, binaries: dict[str, Path], home: Path
) -> None:
    from binlens.loader.digest import sha256_hex

    top = binaries["sample-O2"].parent
    _index([top], home, corpus="s")
    o2, o3 = (sha256_hex(binaries[n].read_bytes()) for n in ("sample-O2", "sample-O3"))
    from binlens.store import ProgramDatabase, database_path
    from binlens.store.fingerprints import load_fingerprints

    # the worker stored the -O2 build's fingerprints in its program database, as `binlens diff` would
    fps = {fp.name: fp for fp in load_fingerprints(ProgramDatabase(database_path(home, o2)))}
    store = _store(home)
    found = []
    for name in ("checksum", "classify", "add_numbers", "apply"):
        hits = store.search_function("s", fps[name], limit=10)
        found += [name] if any(h.sha256 == o3 and h.name == name for h in hits) else []
    assert found == ["checksum", "classify", "add_numbers", "apply"]


def test_cli_bad_store_and_ray_address_are_clear_errors(binaries: dict[str, Path], home: Path) -> None:
    top = str(binaries["sample-O2"].parent)
    proc = _cli(top, "--corpus", "e", "--store", "mysql://x", "--json", home=home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "--corpus-store" in err  # (refused by the argument's check)
    proc = _cli(top, "--corpus", "e", "--store", "postgresql://binlens@127.0.0.1:1/x", "--json", home=home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err and "binlens: error:" in err
    assert json.loads(out)["error"]["target"] == "/options/corpus_store"
    proc = _cli(top, "--corpus", "e", "--ray-address", "127.0.0.1:1", "--json", home=home)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err
    assert json.loads(out)["error"] | {"message": ""} == {
        "status": 503,
        "code": "unavailable",
        "message": "",
        "target": "/options/ray_address",
        "details": {},
    }


def test_a_string_spelled_like_a_stored_hash_indexes(ray_address: str, home: Path, tmp_path: Path) -> None:
    """`#!/bin/sh` is 9 characters starting with `#`, as the store spells a string's hash: such a
    binary is indexed (its write once raised out of the store and ended the whole run)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    src = tmp_path / "shebang.c"
    src.write_text('#include <stdio.h>\nint main(void) { puts("#!/bin/sh"); return 0; }\n')
    folder = tmp_path / "bin"
    folder.mkdir()
    subprocess.run([cc, "-O2", "-o", str(folder / "shebang"), str(src)], check=True, capture_output=True)
    report = _index([folder], home, corpus="sh")
    assert report.indexed == 1 and not report.failed
    hits = _store(home).search_string("sh", "#!/bin/sh", mode="exact")
    assert [Path(h.file).name for h in hits] == ["shebang"]


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
    return False


def test_a_worker_that_dies_fails_its_file_alone(ray_address: str, home: Path, tmp_path: Path) -> None:
    """A worker killed mid-file (as by a crash in native code or the OOM killer) is that file's
    failure; the run completes and the next run indexes the file on a new worker."""
    import threading

    big = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    if not big.is_file():
        pytest.skip("no libc.so.6 to analyse for long enough")
    one = tmp_path / "one"
    one.mkdir()
    shutil.copyfile(big, one / "libc.so.6")
    killed: list[int] = []
    done = threading.Event()

    def kill_the_worker() -> None:  # this test run's Ray worker busy with the file, once
        while not done.is_set() and not killed:
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if cmd.startswith(b"ray::index_task") and _descends_from(int(entry), os.getpid()):
                    os.kill(int(entry), signal.SIGKILL)
                    killed.append(int(entry))
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_the_worker, daemon=True)
    killer.start()
    try:
        report = _index([one], home, corpus="crash")
    finally:
        done.set()
        killer.join()
    assert killed and report.indexed == 0 and [f.code for f in report.failed] == ["internal"]
    assert "died" in report.failed[0].message, report.failed[0]
    again = _index([one], home, corpus="crash")
    assert again.indexed == 1 and not again.failed
