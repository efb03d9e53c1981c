"""`binlens debug [OPTIONS] FILE [-- ARGS]`: a small interactive debugger for a person at a terminal.

It starts FILE under gdb (the debug domain's methods, as a server with `--allow-debug` serves
them) stopped at its first instruction and reads commands, one a line, from stdin: places are the
program's static names and addresses (`main`, `sub_1240`, `0x1240`, `parse+0x10`), `*0x5555...`
is a runtime address. `help` lists the commands.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from binlens.cli.main import command, make_workspace
from binlens.cli.server_args import confinement

HELP = """commands (places: a name, sub_1240, 0x1240 (static), *0x5555... (runtime)):
  break|b PLACE [if COND]   breakpoint (hbreak PLACE: hardware)     watch PLACE [SIZE]   write watchpoint
  run|r|continue|c          run to the next stop                   step|si / next|ni    one instruction
  finish                    run until the function returns          until PLACE          run to a place
  regs [NAME...]            registers                               x PLACE [SIZE]       memory (hex dump)
  bt                        backtrace                               threads / maps       threads, mappings
  delete ID                 delete a breakpoint or watchpoint       info / events        the session, its stops
  locals [FRAME]            arguments and locals (debug info)       print|p EXPR         an expression's value
  kill                      kill the target                         quit|q               kill and leave"""


def _debug_args(p: argparse.ArgumentParser) -> None:
    """Debug FILE interactively (gdb): break, run, step, regs, x, bt; `help` lists the commands."""
    p.add_argument("file", metavar="FILE", help="the program to run (binlens's options come before it)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="its arguments: everything after FILE")


def _place(text: str) -> dict[str, Any]:
    """A place as the methods take it: a runtime `address`, or a static `selector`."""
    if text.startswith("*"):
        return {"address": text[1:]}
    if text.lower().startswith("0x"):
        return {"selector": {"address": text}}
    return {"selector": {"name": text}}


def _where(item: dict[str, Any]) -> str:
    """`0x5555... (static 0x1240, work+0x4)` for an event or a frame."""
    text = item.get("address") or "?"
    extra = []
    if item.get("static_address"):
        extra.append(f"static {item['static_address']}")
    fn = item.get("function")
    if fn:
        extra.append(f"{fn['name']}+{fn['offset']:#x}" if fn["offset"] else fn["name"])
    elif item.get("gdb_function"):
        extra.append(item["gdb_function"])
    return f"{text} ({', '.join(extra)})" if extra else text


def _event(ev: dict[str, Any] | None, state: str) -> str:
    if ev is None:
        return f"[{state}]"
    kind = ev["kind"]
    if kind == "exited":
        return f"[exited with code {ev['exit_code']}]"
    head = kind
    if kind == "breakpoint":
        head = f"breakpoint {ev['breakpoint']}"
    elif kind == "watchpoint" and ev.get("watchpoint"):
        w = ev["watchpoint"]
        head = f"watchpoint {w['id']}: {w.get('old')} -> {w.get('new')}"
    elif kind == "signal" and ev.get("signal"):
        head = f"signal {ev['signal']['name']}"
    return f"[{head}] {_where(ev)}"


class Repl:
    """The command loop over one debug session."""

    def __init__(self, ws: Any, debug_id: str, out: Any) -> None:
        self.ws = ws
        self.d = debug_id
        self.out = out

    def call(self, method: str, **params: Any) -> Any:
        """Invoke a method of the session."""
        from binlens.api import invoke

        return invoke(self.ws, method, {"debug_id": self.d, **params})

    def say(self, text: str) -> None:
        """One line to the user."""
        self.out.write(text + "\n")
        self.out.flush()

    def run_line(self, line: str) -> bool:
        """Run one command; False to leave."""
        words = shlex.split(line)
        if not words:
            return True
        verb, rest = words[0], words[1:]
        if verb in ("quit", "q", "exit"):
            return False
        handler = getattr(
            self,
            "cmd_"
            + {
                "b": "break",
                "r": "run",
                "c": "run",
                "continue": "run",
                "si": "step",
                "ni": "next",
                "until": "until",
                "hbreak": "break",
                "p": "print",
            }.get(verb, verb),
            None,
        )
        if handler is None:
            self.say(f"unknown command {verb!r}; help lists them")
            return True
        handler(verb, rest)
        return True

    def cmd_help(self, _verb: str, _rest: list[str]) -> None:
        self.say(HELP)

    def cmd_break(self, verb: str, rest: list[str]) -> None:
        if not rest:
            self.say("break PLACE [if COND]")
            return
        cond = " ".join(rest[2:]) if len(rest) > 2 and rest[1] == "if" else None
        bp = self.call("breakpoint.create", **_place(rest[0]), hardware=verb == "hbreak", condition=cond)
        self.say(f"breakpoint {bp['id']} at {_where(bp)}")

    def cmd_watch(self, _verb: str, rest: list[str]) -> None:
        if not rest:
            self.say("watch PLACE [SIZE]")
            return
        size = int(rest[1]) if len(rest) > 1 else 8
        wp = self.call("watchpoint.create", **_place(rest[0]), size=size)
        self.say(f"watchpoint {wp['id']} at {_where(wp)}, {size} bytes")

    def _resume(self, method: str, **params: Any) -> None:
        got = self.call(method, wait_ms=60000, **params)
        self.say(_event(got.get("event"), got["state"]))

    def cmd_run(self, _verb: str, _rest: list[str]) -> None:
        self._resume("debug.continue")

    def cmd_step(self, _verb: str, _rest: list[str]) -> None:
        self._resume("debug.step")

    def cmd_next(self, _verb: str, _rest: list[str]) -> None:
        self._resume("debug.next")

    def cmd_finish(self, _verb: str, _rest: list[str]) -> None:
        self._resume("debug.finish")

    def cmd_until(self, _verb: str, rest: list[str]) -> None:
        if rest:
            self._resume("debug.run_to", **_place(rest[0]))

    def cmd_regs(self, _verb: str, rest: list[str]) -> None:
        regs = self.call("register.get", names=rest or None)["registers"]
        for i in range(0, len(regs), 3):
            self.say("  ".join(f"{r['name']:>7} {r['value']:<18}" for r in regs[i : i + 3]).rstrip())

    def cmd_x(self, _verb: str, rest: list[str]) -> None:
        if not rest:
            self.say("x PLACE [SIZE]")
            return
        size = int(rest[1], 0) if len(rest) > 1 else 64
        got = self.call("debug_memory.read", **_place(rest[0]), size=size)
        data = bytes.fromhex(got["bytes"])
        base = int(got["address"], 16)
        for off in range(0, len(data), 16):
            row = data[off : off + 16]
            text = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
            self.say(f"{base + off:#018x}  {row.hex(' '):<47}  {text}")
        for gap in got.get("unreadable") or []:
            self.say(f"(unreadable: {gap['size']} bytes at {gap['address']})")

    def cmd_locals(self, _verb: str, rest: list[str]) -> None:
        got = self.call("debug_variable.list", frame=int(rest[0], 0) if rest else 0)
        where = f" at {got['source']['file']}:{got['source']['line']}" if got.get("source") else ""
        self.say(f"frame {got['level']}: {_where(got)}{where}")
        if not got["debug_info"]:
            self.say("  (no debug information for this frame)")
        for v in got["items"]:
            self.say(f"  {v['kind'][:3]} {v['type'] or '?'} {v['name']} = {v['value']}")

    def cmd_print(self, _verb: str, rest: list[str]) -> None:
        if not rest:
            self.say("print EXPR")
            return
        got = self.call("debug_variable.evaluate", expression=" ".join(rest))
        self.say(f"{got['expression']} = {got['value']}" + (f"  ({got['type']})" if got.get("type") else ""))

    def cmd_bt(self, _verb: str, _rest: list[str]) -> None:
        for f in self.call("backtrace.get")["frames"]:
            self.say(f"#{f['level']:<3} {_where(f)}" + (f"  [{f['module']}]" if f.get("module") else ""))

    def cmd_threads(self, _verb: str, _rest: list[str]) -> None:
        for t in self.call("thread.list")["items"]:
            self.say(f"{'*' if t['current'] else ' '} {t['id']:<3} {t['target_id']}  {t['state']}  {_where(t)}")

    def cmd_maps(self, _verb: str, _rest: list[str]) -> None:
        for m in self.call("memory_map.list", page={"limit": 1000})["items"]:
            slide = f"  slide {m['slide']}" if m.get("slide") else ""
            self.say(f"{m['start']:>18}-{m['end']:<18} {m['perms']} {m['path']}{slide}")

    def cmd_delete(self, _verb: str, rest: list[str]) -> None:
        from binlens.errors import BinlensError

        for word in rest:
            try:
                self.call("breakpoint.delete", id=int(word))
            except BinlensError:
                self.call("watchpoint.delete", id=int(word))
            self.say(f"deleted {word}")

    def cmd_info(self, _verb: str, _rest: list[str]) -> None:
        got = self.call("debug.get")
        self.say(f"{got['debug_id']}: pid {got['pid']}, {got['state']}, slide {got['slide']}")
        if got.get("output_tail"):
            self.say("output:\n" + got["output_tail"].rstrip())

    def cmd_events(self, _verb: str, _rest: list[str]) -> None:
        got = self.call("debug.events", page={"limit": 1000})
        for ev in got["items"]:
            self.say(f"{ev['seq']:>4} {_event(ev, got['state'])}")

    def cmd_kill(self, _verb: str, _rest: list[str]) -> None:
        got = self.call("debug.kill")
        self.say(f"[killed: {got['state']}]")


@command("debug", _debug_args)
def cmd_debug(args: argparse.Namespace) -> int:
    """Start FILE under gdb and run the commands read from stdin until EOF or `quit`."""
    from binlens.api import invoke
    from binlens.errors import BinlensError

    target_args = list(args.args)
    if target_args[:1] == ["--"]:
        target_args = target_args[1:]
    ws = make_workspace(args, permissions=frozenset({"debug"}), **confinement([args.file], []))
    try:
        ws.open(args.file, check_roots=False)
        info = invoke(ws, "debug.start", {"args": target_args})
    except BinlensError as err:
        sys.stderr.write(f"binlens debug: error: {err.message}\n")
        return 1
    out = sys.stdout
    repl = Repl(ws, info["debug_id"], out)
    repl.say(f"pid {info['pid']}, slide {info['slide']}, stopped at its first instruction; help lists the commands")
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            out.write("(binlens) ")
            out.flush()
        line = sys.stdin.readline()
        if not line:
            break
        try:
            if not repl.run_line(line.strip()):
                break
        except BinlensError as err:
            repl.say(f"error: {err.message}")
        except ValueError as err:
            repl.say(f"error: {err}")
    return 0
