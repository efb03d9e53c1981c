"""The human commands print a binary's hostile names as inert, bounded text (real CLI, stdout bytes).

The fixture is a program whose function names, after compiling, are rewritten in place (same
length) into terminal escapes, C1 controls, fake line breaks, bidi overrides and invalid UTF-8, plus
a function with a 100,000-character name, a 1,000-character string and a section renamed to control
bytes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from binlens.loader.image import NAME_CAP
from conftest import ROOT

HOSTILE = [
    b"osc\x1b]0;pwned\x07title",  # sets the terminal's window title
    b"csi\x1b[2J\x1b[31mred",  # clears the screen, turns the text red
    b"nl\nfake line\rcr",  # a fake row, and a carriage return that overwrites it
    b"c1\xc2\x9b31mcsi",  # U+009B, the one-character CSI of C1
    b"bidi\xe2\x80\xaeevil\xe2\x81\xa6x",  # U+202E right-to-left override, U+2066 isolate
    b"ls\xe2\x80\xa8sep\xe2\x80\xa9ps",  # U+2028 line and U+2029 paragraph separators
    b"del\x7ftab\tend",
    b"bad\xff\xfe\xc2utf",  # not UTF-8 at all
    b'dot"] x [\\',  # would close a DOT graph ID early
]
# longer than any table cell, within the loader's name cap (image.NAME_CAP): JSON keeps it whole
LONG_NAME = "long_" + "L" * (NAME_CAP - 100)
LONG_TEXT = "S" * 1000
SECTION = (b".note.ABI-tag\x00", b"\x1b]0;sec\x07\xe2\x80\xaeAB\x00")  # same length: only the bytes change
# Bytes a terminal acts on: C0 controls but the newline, DEL, C1 (UTF-8), U+061C, U+200E/F,
# U+2028-202E, U+2066-2069.
UNSAFE = re.compile(
    rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xd8\x9c|\xe2\x80[\x8e\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]"
)


def _placeholder(i: int, length: int) -> str:
    head = f"hostile{i}_"
    return head + "q" * (length - len(head))


def _source() -> str:
    names = [_placeholder(i, len(h)) for i, h in enumerate(HOSTILE)] + [LONG_NAME]
    lines = [f"__attribute__((noinline)) int {n}(int x) {{ return x * {i + 3} + {i}; }}" for i, n in enumerate(names)]
    lines.append(f'const char banner[] = "{LONG_TEXT}";')
    calls = " + ".join(f"{n}(argc)" for n in names)
    lines.append(f"int main(int argc, char **argv) {{ (void)argv; return banner[argc] + {calls}; }}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    d = tmp_path_factory.mktemp("hostile")
    (d / "hostile.c").write_text(_source())
    subprocess.run([cc, "-O1", "-fPIE", "-pie", "-o", str(d / "hostile"), str(d / "hostile.c")], check=True)
    data = (d / "hostile").read_bytes()
    for i, name in enumerate(HOSTILE):
        placeholder = _placeholder(i, len(name)).encode()
        assert placeholder in data and len(placeholder) == len(name)
        data = data.replace(placeholder, name)
    assert SECTION[0] in data and len(SECTION[0]) == len(SECTION[1])
    (d / "hostile").write_bytes(data.replace(*SECTION))
    return d / "hostile"


@pytest.fixture(scope="module")
def cli_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-home")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`python -m binlens ARGS`, its output as bytes."""
    env = dict(os.environ, BINLENS_HOME=str(home))
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NO_COLOR", None)
    return subprocess.run([sys.executable, "-m", "binlens", *args], capture_output=True, env=env, timeout=300)


def assert_inert(out: bytes, max_line: int = 1000) -> None:
    """No byte a terminal acts on, no row wider than `max_line` characters."""
    hit = UNSAFE.search(out)
    assert hit is None, out[max(0, hit.start() - 60) : hit.end() + 20]
    assert max(len(line) for line in out.decode("utf-8").split("\n")) <= max_line


def test_functions_table_escapes_names_and_cuts_long_ones(hostile: Path, cli_home: Path) -> None:
    r = cli(cli_home, "functions", str(hostile))
    assert r.returncode == 0, r.stderr
    assert_inert(r.stdout)
    text = r.stdout.decode()
    for shown in (
        r"osc\x1b]0;pwned\x07title",
        r"csi\x1b[2J\x1b[31mred",
        r"nl\nfake line\rcr",
        r"c1\x9b31mcsi",
        r"bidi\u202eevil\u2066x",
        r"ls\u2028sep\u2029ps",
        r"del\x7ftab\tend",
    ):
        assert shown in text
    rows = [line for line in text.splitlines() if "│" in line]
    assert len(rows) == len(json.loads(cli(cli_home, "functions", str(hostile), "--json").stdout)["functions"])
    assert len(r.stdout) < 20_000  # the long name is cut to 200
    assert "long_" + "L" * 194 + "…" in text and LONG_NAME not in text
    full = cli(cli_home, "functions", str(hostile), "--full")
    assert full.returncode == 0 and LONG_NAME in full.stdout.decode()
    assert_inert(full.stdout, max_line=len(LONG_NAME) + 200)


def test_json_output_keeps_whole_values(hostile: Path, cli_home: Path) -> None:
    r = cli(cli_home, "functions", str(hostile), "--json")
    names = {f["name"] for f in json.loads(r.stdout)["functions"]}
    assert "osc\x1b]0;pwned\x07title" in names and LONG_NAME in names  # JSON escapes; it is not cut


@pytest.mark.parametrize(
    "args",
    [
        ["symbols"],
        ["info"],
        ["disasm", "main"],
        ["xrefs", "main", "--from", "--function"],
        ["strings"],
        ["cfg", "--format", "dot"],
        ["cfg", "--format", "mermaid"],
    ],
)
def test_every_human_command_prints_inert_text(hostile: Path, cli_home: Path, args: list[str]) -> None:
    command, *rest = args
    if command == "cfg":
        rest = ["0x" + _address_of(cli_home, hostile, HOSTILE[0]), *rest]
    r = cli(cli_home, command, str(hostile), *rest)
    assert r.returncode == 0, r.stderr
    assert_inert(r.stdout)
    assert len(r.stdout) < 60_000
    if command in ("symbols", "disasm", "xrefs"):
        assert rb"osc\x1b]0;pwned\x07title" in r.stdout and rb"nl\nfake line\rcr" in r.stdout
    if command == "info":
        assert rb"\x1b]0;sec\x07\u202eAB" in r.stdout  # the section's name
    if command == "strings":
        assert b"S" * 200 not in r.stdout and ("S" * 199 + "…").encode() in r.stdout


def test_disasm_of_a_hostile_function_and_its_error_messages(hostile: Path, cli_home: Path) -> None:
    address = "0x" + _address_of(cli_home, hostile, HOSTILE[2])
    r = cli(cli_home, "disasm", str(hostile), address)
    assert r.returncode == 0, r.stderr
    assert_inert(r.stdout)
    assert r.stdout.startswith(rb"nl\nfake line\rcr:" + b"\n")
    bad = cli(cli_home, "disasm", str(hostile), "no\x1b]0;such\x07")
    assert bad.returncode == 1 and bad.stdout == b""
    assert rb"no\x1b]0;such\x07" in bad.stderr and b"\x1b" not in bad.stderr


def _address_of(home: Path, binary: Path, name: bytes) -> str:
    listing = json.loads(cli(home, "functions", str(binary), "--json").stdout)["functions"]
    wanted = name.decode("utf-8", "backslashreplace")
    return next(f["address"][2:] for f in listing if f["name"] == wanted)


def test_cfg_dot_quotes_the_name_whole(hostile: Path, cli_home: Path) -> None:
    address = "0x" + _address_of(cli_home, hostile, HOSTILE[-1])
    r = cli(cli_home, "cfg", str(hostile), address, "--format", "dot")
    assert r.returncode == 0, r.stderr
    first = r.stdout.decode().splitlines()[0]
    assert re.fullmatch(r'digraph "((?:[^"\\]|\\.)*)" \{', first), first  # one quoted ID, then the body
    assert first == 'digraph "dot\'] x [\\\\" {'
