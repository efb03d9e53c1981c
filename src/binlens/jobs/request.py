"""What the caller sends the analysis process: the request, and the progress callback's shape.

Both ends import this module: the request travels pickled (`binlens.frames`), by its class's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES

Progress = Callable[[float, float | None, str | None], None]


@dataclass
class AnalysisRequest:
    """What the analysis process needs: which file, which bytes, where to save, the user's starts."""

    path: str
    sha256: str
    db_path: str
    slice_name: str | None = None
    extra_starts: list[int] = field(default_factory=list)
    excluded_starts: list[int] = field(default_factory=list)
    flow_overrides: dict[int, str] = field(default_factory=dict)  # the user's, {instruction address: kind}
    parse_timeout_s: float = 8.0
    data: bytes | None = None  # the bytes themselves, when the file changed on disk since it was opened
    home: str | None = None  # an early start (the CLI, before it opened the program): the database's home
    image: tuple | None = None  # the caller's parsed image (`encode_image`): no second parse here
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # the most of the file read again (the caller's opened size)
    run_id: str | None = None  # the run this is (allocated by the caller before it starts), saved with the rows
