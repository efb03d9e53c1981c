"""Under roots, only regular files inside them are read: FIFOs and devices are refused without
blocking, and a name swapped for a symbolic link while it is opened never reads outside."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.loader.input_file import read_input
from binlens.workspace import Config, Workspace


def _open_error(ws: Workspace, path: str) -> BinlensError:
    with pytest.raises(BinlensError) as err:
        invoke(ws, "program.open", {"path": path})
    return err.value


@pytest.fixture()
def rooted(tmp_path: Path, home: Path) -> tuple[Workspace, Path]:
    root = tmp_path / "root"
    root.mkdir()
    return Workspace(Config(home=home, roots=[root])), root


def test_fifo_under_root_refused_without_blocking(rooted: tuple[Workspace, Path]) -> None:
    ws, root = rooted
    fifo = root / "pipe"
    os.mkfifo(fifo)
    done: list[BinlensError] = []
    # Four opens (as many as the call slots): each must answer, none may wait for a writer.
    threads = [threading.Thread(target=lambda: done.append(_open_error(ws, str(fifo)))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "opening a FIFO blocked"
    assert [(e.code, e.target) for e in done] == [("invalid_argument", "/params/path")] * 4
    assert "FIFO" in done[0].message


def test_devices_sockets_and_folders_refused(home: Path) -> None:
    import socket
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="blr-", dir="/tmp"))  # short: AF_UNIX paths are at most 108 bytes
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(root / "sock"))
        (root / "sub").mkdir()
        ws = Workspace(Config(home=home, roots=[root, Path("/dev")]))
        cases = (("sock", "socket"), ("sub", "directory"), ("/dev/zero", "character device"))
        for name, word in cases:
            err = _open_error(ws, str(root / name))
            assert (err.code, err.target) == ("invalid_argument", "/params/path"), name
            assert word in err.message, err.message
    finally:
        server.close()
        shutil.rmtree(root)


def _swapper(stop: threading.Event, swap: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            swap()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _file_link_swap(root: Path, secret: Path) -> Callable[[], None]:
    """One round of `root/x` becoming a hard link to `root/inside`, then a symbolic link to `secret`."""

    def swap() -> None:
        os.link(root / "inside", root / ".f")
        os.replace(root / ".f", root / "x")
        os.symlink(secret, root / ".l")
        os.replace(root / ".l", root / "x")

    return swap


def test_symlink_swapped_at_last_component_never_escapes(tmp_path: Path) -> None:
    """`root/x` flips between a regular file inside and a symbolic link to a file outside."""
    root, out = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    out.mkdir()
    inside_bytes, outside_bytes = b"\x7fELF inside" * 100, b"\x7fELF OUTSIDE" * 100
    (root / "inside").write_bytes(inside_bytes)
    (out / "secret").write_bytes(outside_bytes)

    swap = _file_link_swap(root, out / "secret")

    stop = threading.Event()
    swap()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (the swapper runs between the reader's steps, not once per 5 ms)
    t = _swapper(stop, swap)
    seen: dict[str, int] = {}
    try:
        # at least 3,000 reads, and on until the race was seen both ways (at most 30,000)
        for i in range(30_000):
            if i >= 3000 and seen.get("inside", 0) and seen.get("outside roots", 0):
                break
            try:
                data = read_input(root / "x", roots=[root]).data
            except BinlensError as err:
                assert err.code in ("invalid_argument", "not_found") and err.target == "/params/path"
                key = "outside roots" if "outside the allowed roots" in err.message else err.message.split(" ", 1)[1]
                seen[key] = seen.get(key, 0) + 1
                continue
            assert data == inside_bytes, "read a file outside the root"
            seen["inside"] = seen.get("inside", 0) + 1
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(interval)
    assert seen.get("inside", 0) > 0 and seen.get("outside roots", 0) > 0, seen


def test_folder_swapped_on_the_way_never_escapes(tmp_path: Path) -> None:
    """`root/d` flips between a folder inside and a symbolic link to a folder outside."""
    root, out = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    out.mkdir()
    (root / "real").mkdir()
    inside_bytes, outside_bytes = b"\x7fELF inside" * 100, b"\x7fELF OUTSIDE" * 100
    (root / "real" / "f").write_bytes(inside_bytes)
    (out / "f").write_bytes(outside_bytes)
    (root / "link").symlink_to(out)

    def swap() -> None:
        os.rename(root / "real", root / "d")
        time.sleep(0)
        os.rename(root / "d", root / "real")
        os.rename(root / "link", root / "d")
        time.sleep(0)
        os.rename(root / "d", root / "link")

    stop = threading.Event()
    t = _swapper(stop, swap)
    reads = 0
    try:
        for _ in range(3000):
            try:
                data = read_input(root / "d" / "f", roots=[root]).data
            except BinlensError as err:
                assert err.code in ("invalid_argument", "not_found") and err.target == "/params/path"
                continue
            assert data == inside_bytes, "read a file outside the root"
            reads += 1
    finally:
        stop.set()
        t.join()
    assert reads > 0


def test_program_open_race_never_opens_outside(tmp_path: Path, home: Path, compile_c) -> None:
    """Through program.open: the opened program is always the one inside the root."""
    root, out = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    out.mkdir()
    sample = compile_c("sample.c")
    shutil.copy(sample, root / "inside")
    other = bytearray(sample.read_bytes())
    other[-1] ^= 0xFF  # same program, another digest
    (out / "secret").write_bytes(bytes(other))
    ws = Workspace(Config(home=home, roots=[root]))
    inside_sha = invoke(ws, "program.open", {"path": str(root / "inside")})["identity"]["sha256"]

    swap = _file_link_swap(root, out / "secret")

    stop = threading.Event()
    swap()
    t = _swapper(stop, swap)
    try:
        for _ in range(1000):
            try:
                sha = invoke(ws, "program.open", {"path": str(root / "x")})["identity"]["sha256"]
            except BinlensError as err:
                assert (err.code, err.target) == ("invalid_argument", "/params/path"), err.message
                continue
            assert sha == inside_sha, "program.open read a file outside the root"
    finally:
        stop.set()
        t.join()


def test_mcp_fifo_opens_do_not_hold_the_call_slots(tmp_path: Path, compile_c) -> None:
    """`binlens mcp --root R`: five opens of a FIFO at once (one more than the call slots) are all
    refused without blocking, and an open of a real file after them runs: no slot stays held.

    The four that get a slot are refused as a FIFO; the fifth, arriving while they run, may find
    every slot taken (`busy`) on a loaded machine."""
    from test_mcp_stdio import INIT, StdioClient, msg

    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "pipe")
    shutil.copy(compile_c("sample.c"), root / "sample")

    def open_call(rid: int, path: Path) -> bytes:
        args = {"operation": "open", "params": {"path": str(path)}}
        call = {"name": "binlens_program", "arguments": args}
        return msg({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call})

    client = StdioClient(tmp_path, "--root", str(root))
    try:
        client.send(msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        client.answer(1)
        client.send(*(open_call(rid, root / "pipe") for rid in range(2, 7)))
        client.answer(6, timeout=30)  # (the answers come in any order: the earlier ones are in `seen`)
        replies = {f["id"]: f for f in client.seen if f.get("id") in range(2, 7)}
        while len(replies) < 5:
            frame = client.frames.get(timeout=30)
            assert frame is not None, bytes(client.err).decode()
            if frame.get("id") in range(2, 7):
                replies[frame["id"]] = frame
        errors = []
        for rid in range(2, 7):
            result = replies[rid]["result"]
            assert result["isError"] is True
            errors.append(result["structuredContent"]["error"])
        fifo = [e for e in errors if (e["code"], e["target"]) == ("invalid_argument", "/params/path")]
        assert len(fifo) >= 4 and all("FIFO" in e["message"] for e in fifo), errors
        assert all(e["code"] == "busy" for e in errors if e not in fifo), errors
        client.send(open_call(7, root / "sample"))
        assert client.answer(7, timeout=60)["result"]["isError"] is False
    finally:
        assert client.close() == 0, bytes(client.err).decode()
