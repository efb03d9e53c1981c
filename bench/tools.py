"""The tools the benchmarks compare, each run as its own process under `/usr/bin/time -v`.

binlens runs through its CLI (`binlens functions FILE --json`) with a fresh program database, so
every run is a full analysis. The peers (angr, smda, ddisasm) run through `peer_driver.py` in the
peers venv (bench/requirements.txt). `objdump -d` is the speed baseline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS = ("angr", "smda", "ddisasm")
ALL_TOOLS = ("binlens", *PEERS)
BASELINES = ("eh_frame",)  # accuracy only: the FDE starts alone (on ARM also .ARM.exidx), read by binutils' readelf
TIME = "/usr/bin/time"


class Unavailable(Exception):
    """The tool cannot run on this machine at all (the reason goes into the table as `n/a: <reason>`)."""


@dataclass
class Run:
    """One measured run of a tool on a file."""

    tool: str
    starts: list[int] = field(default_factory=list)
    wall: float | None = None  # seconds, whole process (start-up included)
    cpu: float | None = None  # user + system seconds, children included
    rss_kb: int | None = None  # peak resident set size of the largest process, KiB
    error: str | None = None  # the run failed (timeout, crash); starts is then empty

    def to_json(self) -> dict:
        """Plain dict for the result cache."""
        return self.__dict__.copy()


def _parse_time_v(text: str) -> tuple[float | None, float | None, int | None]:
    wall = cpu = rss = None
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", text)
    if m:
        wall = int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    u = re.search(r"User time \(seconds\): ([\d.]+)", text)
    s = re.search(r"System time \(seconds\): ([\d.]+)", text)
    if u and s:
        cpu = float(u.group(1)) + float(s.group(1))
    r = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if r:
        rss = int(r.group(1))
    return wall, cpu, rss


def measure(cmd: list[str], timeout: float, env: dict | None = None, stdout_path: Path | None = None) -> Run:
    """Run cmd under `/usr/bin/time -v`; fill wall, cpu and rss; error on non-zero exit or timeout."""
    if not Path(TIME).exists():
        raise Unavailable("/usr/bin/time missing (apt-get install time)")
    with tempfile.NamedTemporaryFile("w+", suffix=".time") as tf:
        out = open(stdout_path, "w") if stdout_path else subprocess.DEVNULL  # noqa: SIM115
        stderr = ""
        try:
            proc = subprocess.run(
                [TIME, "-v", "-o", tf.name, *cmd],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                timeout=timeout,
                env=env,
                start_new_session=True,
            )
            stderr = proc.stderr or ""
            err = None if proc.returncode == 0 else f"exit {proc.returncode}: {_last_line(stderr)}"
        except subprocess.TimeoutExpired:
            err = f"timeout after {timeout:.0f}s"
        finally:
            if stdout_path:
                out.close()
        wall, cpu, rss = _parse_time_v(Path(tf.name).read_text())
    run = Run(tool=cmd[0], wall=wall, cpu=cpu, rss_kb=rss, error=err)
    if err and err.startswith("timeout"):
        run.wall = timeout
    return run


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:200]


# ---------------------------------------------------------------------------------------------- binlens


def binlens_command() -> list[str]:
    """The binlens CLI: the repo's venv if built, else `binlens` on PATH."""
    exe = REPO / ".venv" / "bin" / "binlens"
    found = str(exe) if exe.exists() else shutil.which("binlens")
    if not found:
        raise Unavailable("binlens CLI not installed (make .venv/.installed)")
    return [found]


_binlens_mode: list[str] = []


def binlens_mode() -> str:
    """`cli` when `binlens functions` exists, else `api` when the engine imports (binlens_driver.py)."""
    if not _binlens_mode:
        cmd = binlens_command()
        if subprocess.run([*cmd, "functions", "--help"], capture_output=True).returncode == 0:
            _binlens_mode.append("cli")
        else:
            py = Path(cmd[0]).with_name("python")
            probe = subprocess.run([str(py), "-c", "import binlens.analysis.engine"], capture_output=True)
            if probe.returncode != 0:
                raise Unavailable("this binlens has neither a `functions` command nor the analysis engine")
            _binlens_mode.append("api")
    return _binlens_mode[0]


def binlens_version() -> str:
    """Which binlens runs: a hash of the source files of the package the interpreter imports (so a
    checkout or PYTHONPATH change is a new version for the result caches), plus the mode."""
    py = Path(binlens_command()[0]).with_name("python")
    code = "import binlens, pathlib; print(pathlib.Path(binlens.__file__).parent)"
    pkg = Path(subprocess.run([str(py), "-c", code], capture_output=True, text=True).stdout.strip())
    # bytecode as an installed package has it: an edited checkout (or PYTHONDONTWRITEBYTECODE in the
    # caller's environment) would otherwise compile its changed modules again in every timed run
    subprocess.run([str(py), "-m", "compileall", "-q", str(pkg)], capture_output=True, env=_bytecode_env())
    digest = hashlib.sha1()
    for f in sorted(pkg.rglob("*.py")):
        digest.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    mode = "" if binlens_mode() == "cli" else " (API)"
    return f"src {digest.hexdigest()[:10]}{mode}"


def _bytecode_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def parse_binlens_functions(text: str) -> list[int]:
    """Function addresses from `binlens functions --json` output (a list, or an object holding one)."""
    data = json.loads(text)
    if isinstance(data, dict):
        for key in ("items", "functions", "result"):
            if key in data:
                return parse_binlens_functions(json.dumps(data[key]))
        raise ValueError(f"unexpected JSON object with keys {sorted(data)[:10]}")
    starts = []
    for item in data:
        addr = item["address"] if isinstance(item, dict) else item
        starts.append(int(addr, 0) if isinstance(addr, str) else int(addr))
    return starts


def run_binlens(path: Path, timeout: float) -> Run:
    """Full analysis with a fresh program database; starts from `binlens functions --json`
    (or, before the CLI has that command, `analyze` in-process through binlens_driver.py)."""
    cmd = binlens_command()
    if binlens_mode() == "api":
        py = Path(cmd[0]).with_name("python")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "starts.json"
            run = measure([str(py), str(HERE / "binlens_driver.py"), str(path), "--out", str(out)], timeout)
            run.tool = "binlens"
            if not run.error:
                run.starts = json.loads(out.read_text())["starts"]
        return run
    with tempfile.TemporaryDirectory(prefix="binlens-bench-home-") as home, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "functions.json"
        env = {**os.environ, "BINLENS_HOME": home}
        run = measure([*cmd, "functions", str(path), "--json", "--home", home], timeout, env=env, stdout_path=out)
        run.tool = "binlens"
        if not run.error:
            try:
                run.starts = sorted(set(parse_binlens_functions(out.read_text())))
            except (ValueError, KeyError, TypeError) as exc:
                run.error = f"unreadable output: {exc}"
    return run


# ---------------------------------------------------------------------------------------------- peers


def peers_python(workdir: Path) -> Path:
    """The peers venv's interpreter (BINLENS_BENCH_PEERS overrides)."""
    env = os.environ.get("BINLENS_BENCH_PEERS")
    py = Path(env) / "bin" / "python" if env else workdir / "peers-venv" / "bin" / "python"
    if not py.exists():
        raise Unavailable(
            f"peers venv missing: python3 -m venv {py.parent.parent} && pip install -r bench/requirements.txt"
        )
    return py


_available: dict[str, str | None] = {}


def check_peer(tool: str, workdir: Path) -> None:
    """Raise Unavailable with the reason when a peer cannot be imported/run here (checked once)."""
    if tool not in _available:
        py = peers_python(workdir)
        probe = {
            "angr": "import angr",
            "smda": "import smda.Disassembler",
            "ddisasm": "import gtirb, subprocess\nfrom ddisasm import ddisasm_path\n"
            "with ddisasm_path() as p: subprocess.run([str(p), '--version'], check=True, capture_output=True)",
        }[tool]
        proc = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=300)
        _available[tool] = None if proc.returncode == 0 else _last_line(proc.stderr) or f"exit {proc.returncode}"
    if _available[tool]:
        raise Unavailable(_available[tool])


def peer_version(tool: str, workdir: Path) -> str:
    """Installed version of the peer's package, for result caching."""
    py = peers_python(workdir)
    code = f"import importlib.metadata as m; print(m.version({tool!r}))"
    return subprocess.run([str(py), "-c", code], capture_output=True, text=True).stdout.strip() or "?"


def run_peer(tool: str, path: Path, workdir: Path, timeout: float) -> Run:
    """One peer on one file through peer_driver.py."""
    check_peer(tool, workdir)
    py = peers_python(workdir)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "starts.json"
        run = measure([str(py), str(HERE / "peer_driver.py"), tool, str(path), "--out", str(out)], timeout)
        run.tool = tool
        if not run.error:
            run.starts = json.loads(out.read_text())["starts"]
    return run


# the objdump of the files' architecture (speed.py --arch sets the cross binutils' `<triple>-objdump`)
OBJDUMP = "objdump"


def run_objdump(path: Path, timeout: float) -> Run:
    """`objdump -d FILE > /dev/null`: the speed baseline."""
    run = measure([OBJDUMP, "-d", str(path)], timeout)
    run.tool = "objdump"
    return run


def run_eh_frame(path: Path, timeout: float) -> Run:
    """Baseline: the start of every `.eh_frame` FDE (`readelf --debug-dump=frames`), nothing else; on ARM
    also every `.ARM.exidx` entry (`readelf -u`), where gcc puts C functions' unwind information."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "frames.txt"
        run = measure(["readelf", "--debug-dump=frames", str(path)], timeout, stdout_path=out)
        run.tool = "eh_frame"
        starts = re.findall(r" FDE cie=[0-9a-f]+ pc=([0-9a-f]+)\.\.", out.read_text(errors="replace"))
    found = {int(a, 16) for a in starts}
    if Path(path).read_bytes()[:20][18:20] in (b"\x28\x00", b"\x00\x28"):  # e_machine EM_ARM: EHABI tables
        text = subprocess.run(["readelf", "-u", str(path)], capture_output=True, text=True, timeout=timeout).stdout
        found |= {int(a, 16) for a in re.findall(r"^0x([0-9a-f]+)(?: <[^>]*>)?:", text, re.M)}
    run.starts = sorted(found)
    run.error = None  # no .eh_frame at all is an empty answer, not a failure
    return run


def run_tool(tool: str, path: Path, workdir: Path, timeout: float) -> Run:
    """Dispatch by tool name."""
    if tool == "eh_frame":
        return run_eh_frame(path, timeout)
    if tool == "binlens":
        return run_binlens(path, timeout)
    if tool == "objdump":
        return run_objdump(path, timeout)
    return run_peer(tool, path, workdir, timeout)


def tool_version(tool: str, workdir: Path) -> str:
    """Version string used in cache keys and table headers."""
    if tool == "binlens":
        return binlens_version()
    if tool == "eh_frame":
        first = subprocess.run(["readelf", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        return "readelf " + first.split()[-1] + " +exidx"
    if tool == "objdump":
        return subprocess.run([OBJDUMP, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return peer_version(tool, workdir)
