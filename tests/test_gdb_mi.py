"""The GDB/MI fast path answers what pygdbmi answers: every line of a real gdb session over the
debuggee (-O0 -g: frames with source, variables, breakpoints, registers, memory, threads, stops,
errors, console output), and shapes gdb prints elsewhere (repeated keys, lists of results, empty
tuples and lists, strings holding MI's punctuation)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from binlens.providers.gdb_mi import fast_record, parse_record

pytestmark = pytest.mark.timeout(120)
pygdbmi = pytest.importorskip("pygdbmi.gdbmiparser", reason="pip install 'binlens[debug]'")

SHAPES = [
    '1^done,stack=[frame={level="0",addr="0x1"},frame={level="1",addr="0x2"}]',
    '2^done,a={x="1",x="2",x="3"}',
    '3^done,a=["1"],a="2"',
    '4^done,groups=[{id="i1",pid="5"}],e=[],t={}',
    '5^done,x=[y="1",z="2"]',
    '6^done,a=[{b="1"},{c=["2","3"]}],d={},n=[[],["x"]]',
    '7^done,v="a,b=c{[]} x=1",w=""',
    "8^running",
    "^done",
    '*stopped,reason="end-stepping-range",frame={addr="0x1",func="??",args=[]},thread-id="1"',
    '=thread-group-started,id="i1",pid="42"',
    '9^error,msg="No symbol \\"i\\" in current context."',
    '~"hello\\n"',
    "10^done,value=\"'\\\\000' <repeats 63 times>\"",
    '11^done,value="\xe9t\xe9"',
]


RESUMES = {"-exec-run", "-exec-continue", "-exec-next-instruction", "-exec-finish"}


def same(line: str) -> bool:
    """The fast path's answer (when it takes the line) and parse_record's are pygdbmi's."""
    want = pygdbmi.parse_response(line)
    fast = fast_record(line)
    return (fast is None or fast == want) and parse_record(line) == want


def test_shapes_parse_as_pygdbmi_parses_them() -> None:
    for line in SHAPES:
        assert same(line), (line, fast_record(line), pygdbmi.parse_response(line))
    assert all(fast_record(line) is not None for line in SHAPES[:11])
    assert fast_record(SHAPES[11]) is None and fast_record(SHAPES[12]) is None  # (escapes: pygdbmi's)


def test_every_line_of_a_real_gdb_session_parses_as_pygdbmi_parses_it(compile_c: Any) -> None:
    if shutil.which("gdb") is None:
        pytest.skip("gdb is not installed (apt-get install gdb)")
    path = compile_c("debuggee.c", opt="-O0")
    commands = [
        f"-file-exec-and-symbols {path}",
        "-exec-arguments 3",
        "-break-insert work",
        "-break-insert -h main",
        "-break-condition 1 i == 2",
        "-exec-run",
        "-stack-list-frames",
        "-stack-list-variables --all-values",
        "-stack-list-variables --thread 1 --frame 1 --simple-values",
        "-stack-list-variables --thread 1 --frame 1 --all-values",
        "-data-list-register-names",
        "-data-list-register-values x",
        "-data-read-memory-bytes $sp 4096",
        "-data-read-memory-bytes 0 16",
        "-data-evaluate-expression --thread 1 --frame 1 line",
        "-thread-info",
        "-list-thread-groups",
        "-break-list",
        "-break-watch counter",
        "-exec-continue",
        "-exec-next-instruction",
        "-exec-finish",
        '-interpreter-exec console "info registers rip"',
        "-var-create - * total",
        "-break-delete",
        "-exec-continue",
        "-gdb-exit",
    ]
    gdb = subprocess.Popen(
        ["gdb", "-nx", "-q", "--interpreter=mi3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert gdb.stdin is not None and gdb.stdout is not None
    lines: list[str] = []
    try:
        for command in commands:  # one at a time: each read to its result (and its stop)
            gdb.stdin.write(command + "\n")
            gdb.stdin.flush()
            result, stopped = False, command.split()[0] not in RESUMES
            while not (result and stopped) and command != "-gdb-exit":
                line = gdb.stdout.readline().rstrip("\n")
                assert line, "gdb exited"
                if not line.startswith("(gdb)"):
                    lines.append(line)
                result = result or line.startswith("^")
                stopped = stopped or line.startswith("*stopped") or line.startswith("^error")
    finally:
        gdb.kill()
        gdb.wait(30)
    assert any(line.startswith("^done,register-values=") for line in lines), lines[-20:]
    fast = 0
    for line in lines:
        assert same(line), (line, fast_record(line), pygdbmi.parse_response(line))
        fast += fast_record(line) is not None
    results = [line for line in lines if line[:1] in "^*="]
    assert fast >= len(results) * 0.8, (fast, len(results))  # the common records take the fast path
    for prefix in ("^done,register-values=", "^done,memory=", "*stopped,", "^done,stack="):
        assert all(fast_record(line) is not None for line in lines if line.startswith(prefix)), prefix
