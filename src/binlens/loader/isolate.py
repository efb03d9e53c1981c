"""Run the native parser in a child process, under a time budget.

LIEF is C++: a malformed file can crash or hang it. The parser runs in a long-lived worker
process (spawned once, so LIEF is imported once); a crash or a timeout kills only that worker,
which is replaced on the next call.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import threading
from concurrent.futures.process import BrokenProcessPool

from binlens.errors import BinlensError
from binlens.loader.formats import sniff_format
from binlens.loader.image import Image

DEFAULT_PARSE_TIMEOUT = 8.0


def _parse_in_worker(data: bytes, file_name: str, slice_name: str | None) -> Image | BinlensError:
    from binlens.loader.parse_lief import parse_image

    try:
        img = parse_image(data, file_name, slice_name)
    except BinlensError as err:
        return err
    except Exception as err:  # noqa: BLE001 - parser exceptions become clean errors
        return BinlensError("invalid_argument", f"malformed file: the parser rejected it ({type(err).__name__})")
    img.data = b""  # the parent already holds the bytes; do not ship them back
    return img


def _warm() -> bool:
    import binlens.loader.parse_lief  # noqa: F401

    return True


class ParserPool:
    """One isolated parser worker, restarted after a crash or timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: cf.ProcessPoolExecutor | None = None

    def _get(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx)
        return self._pool

    def _kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(Exception):  # already gone
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def parse(
        self, data: bytes, file_name: str, slice_name: str | None = None, timeout: float = DEFAULT_PARSE_TIMEOUT
    ) -> Image:
        """Parse in the worker; raise BinlensError on bad input, a parser crash, or a timeout."""
        sniff_format(data)  # refuse non-executables without waking the native parser
        with self._lock:
            pool = self._get()
            try:
                fut = pool.submit(_parse_in_worker, data, file_name, slice_name)
                out = fut.result(timeout=timeout + 2.0)  # +2 s covers the first worker start
            except cf.TimeoutError:
                self._kill()
                raise BinlensError(
                    "invalid_argument",
                    f"malformed file: parsing took longer than {timeout:.0f} s and was stopped",
                    details={"timeout_s": timeout},
                ) from None
            except BrokenProcessPool:
                self._kill()
                raise BinlensError("invalid_argument", "malformed file: the format parser crashed on it") from None
        if isinstance(out, BinlensError):
            raise out
        out.data = data
        return out

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None


_POOL = ParserPool()


def load_image(path: str, slice_name: str | None = None, timeout: float = DEFAULT_PARSE_TIMEOUT) -> Image:
    """Read `path` once and parse it in the isolated worker."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise BinlensError("not_found", f"no such file: {path}", target="/params/path") from None
    except IsADirectoryError:
        raise BinlensError("invalid_argument", f"{path} is a directory", target="/params/path") from None
    except PermissionError:
        raise BinlensError(
            "invalid_argument", f"cannot read {path}: permission denied", target="/params/path"
        ) from None
    return _POOL.parse(data, os.path.basename(path), slice_name, timeout)


def warm_parser() -> None:
    """Start the parser worker ahead of the first open (servers call this at start-up)."""
    with _POOL._lock:
        _POOL._get().submit(_warm)
