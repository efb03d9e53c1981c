"""Shared fixtures: binaries compiled from tests/fixtures/src, an isolated BINLENS_HOME, the corpus."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_SRC = ROOT / "tests" / "fixtures" / "src"
CORPUS = Path(os.environ.get("BINLENS_CORPUS", ROOT.parent / "shared" / "corpus"))


def analysis_summary(path: Path) -> tuple:
    """Functions (extent, blocks, edges, calls) and references of the analysis of `path`."""
    from binlens.analysis import analyze
    from binlens.loader.parse_lief import parse_path

    r = analyze(parse_path(str(path)))
    functions = [
        (f.address, f.size, [(b.start, b.end) for b in f.blocks], f.edges, f.call_pairs()) for f in r.functions
    ]
    return functions, sorted((x.src, x.dst, x.kind) for x in r.xrefs)


def assert_same_analysis_without(monkeypatch: pytest.MonkeyPatch, module: object, attr: str, path: Path) -> tuple:
    """The analysis of `path` is the same with `module.attr` set to None (a C path turned off)."""
    with_c = analysis_summary(path)
    monkeypatch.setattr(module, attr, None)
    assert analysis_summary(path) == with_c
    return with_c


def corpus_dir(sub: str = "") -> Path:
    """The third-party corpus folder, or skip the test with the reason."""
    path = CORPUS / sub
    if not path.is_dir():
        pytest.skip(f"corpus folder {path} is absent")
    return path


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fixtures")


@pytest.fixture(scope="session")
def compile_c(build_dir: Path) -> Callable[..., Path]:
    """compile_c(source_name, opt='-O2', pie=True, strip=False, extra=()) -> path (cached)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    cache: dict[tuple, Path] = {}

    def build(name: str, opt: str = "-O2", pie: bool = True, strip: bool = False, extra: tuple[str, ...] = ()) -> Path:
        if cc is None:
            pytest.skip("no C compiler (cc) on this machine")
        key = (name, opt, pie, strip, extra)
        if key in cache:
            return cache[key]
        tag = f"{Path(name).stem}{opt}{'-pie' if pie else '-nopie'}{'-stripped' if strip else ''}"
        tag += "".join(x.replace("-", "_").replace("=", "_") for x in extra)
        out = build_dir / tag
        args = [cc, opt, "-g", "-o", str(out), str(FIXTURE_SRC / name), *extra]
        args += ["-fPIE", "-pie"] if pie else ["-fno-pie", "-no-pie"]
        subprocess.run(args, check=True, capture_output=True)
        if strip:
            subprocess.run(["strip", "-s", str(out)], check=True, capture_output=True)
        cache[key] = out
        return out

    return build


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated BINLENS_HOME for one test."""
    h = tmp_path / "home"
    monkeypatch.setenv("BINLENS_HOME", str(h))
    return h


@pytest.fixture()
def workspace(home: Path):
    from binlens.api import REGISTRY  # noqa: F401 - registers the domains
    from binlens.workspace import Config, Workspace

    return Workspace(Config(home=home))


def run_cli(
    *args: str, home: Path | None = None, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `python -m binlens ARGS` in a real child process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if home is not None:
        env["BINLENS_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "binlens", *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the test run (tests/corpus_support.py), or skip when
    PostgreSQL is not installed."""
    from corpus_support import PostgresServer, postgres_bin

    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (scripts/system-packages.sh test installs Debian's postgresql)")
    server = PostgresServer(bindir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
