"""Flow overrides: the user says how an instruction's flow differs from what it decodes to.

The explorer's chunks end at every branch, call and return, so an override is a rewrite of the
terminator of the chunks whose last instruction it names, made as each chunk is decoded
(`Explorer.override_flows` wraps its decoders): every later pass (descent, bodies, blocks, calls,
references) sees the flow the user gave. The kinds follow Ghidra's `FlowOverride`:

- `branch`: a call taken as a jump (its target is a jump target or a tail call; no fall-through);
- `call`: a jump taken as a call to its target, coming back to the next instruction (a conditional
  jump becomes a call whose fall-through is the branch not taken);
- `call_return`: a call that does not come back (no fall-through edge; the call stays a call);
- `return`: an unconditional jump taken as a return.

A call without its fall-through keeps the call (the callee stays in the call graph) and points
its fall-through at `NO_RETURN`, an address no code has that the bodies' walks take as a function
start (`Explorer.stops`): reaching another function's start ends a path without an edge, which is
what a call that does not return is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from binlens.analysis.model import T_CALL, T_COND, T_ICALL, T_IJUMP, T_JUMP, T_RET

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Chunk

FlowOverride = Literal["branch", "call", "call_return", "return"]
FLOW_OVERRIDES: tuple[str, ...] = ("branch", "call", "call_return", "return")
NO_RETURN = (1 << 63) - 2  # the fall-through of a call that does not return: never code, a "start"

# the instruction flows (`model.FLOW_KINDS`) each override applies to
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "branch": ("call", "indirect_call"),
    "call": ("jump", "conditional", "indirect_jump"),
    "call_return": ("call", "indirect_call"),
    "return": ("jump", "indirect_jump"),
}


def override_chunk(chunk: Chunk, kind: str) -> Chunk:
    """`chunk` (end, terminator, targets, last) with its last instruction's flow overridden by `kind`;
    unchanged where the override does not apply to its terminator."""
    end, term, t, last = chunk
    if kind == "branch" and term in (T_CALL, T_ICALL):
        return (end, T_JUMP if term == T_CALL else T_IJUMP, (t[0],), last)
    if kind == "call_return" and term in (T_CALL, T_ICALL):
        return (end, term, (t[0], NO_RETURN), last)
    if kind == "call":
        if term == T_JUMP:
            return (end, T_CALL, (t[0], end), last)
        if term == T_COND:
            return (end, T_CALL, (t[0], t[1]), last)
        if term == T_IJUMP:
            return (end, T_ICALL, (t[0], t[1] if len(t) > 1 else end), last)
    if kind == "return" and term in (T_JUMP, T_IJUMP) and len(t) == 1:
        return (end, T_RET, (), last)
    return chunk
