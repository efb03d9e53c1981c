"""Call slots shared by every transport of one server: at most N API calls run at once.

MCP (stdio, /mcp, /sse) and /ws take their slots from the same counter, so `--max-concurrent`
bounds the whole server, not each transport; beyond it a call fails at once with `busy`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from binlens.workspace import Workspace


class CallSlots:
    """A counter of running calls with a hard limit (no queue)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._running = 0
        self._lock = threading.Lock()

    def try_take(self) -> bool:
        """Take a slot, or say there is none free."""
        with self._lock:
            if self._running >= self.limit:
                return False
            self._running += 1
            return True

    def give(self) -> None:
        """Give a slot back."""
        with self._lock:
            self._running -= 1

    @property
    def running(self) -> int:
        """Calls holding a slot right now."""
        return self._running


def shared_slots(ws: Workspace, limit: int) -> CallSlots:
    """The server's one `CallSlots`, kept on its workspace (the first transport sets the limit)."""
    slots: CallSlots | None = ws.extensions.get("call_slots")
    if slots is None:
        slots = ws.extensions["call_slots"] = CallSlots(limit)
    return slots
