"""function.*: the functions the engine found, their blocks and control-flow graphs."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field

from binlens.analysis.model import SOURCES
from binlens.api.analysis import NeedsAnalysis, need_view, select_function
from binlens.api.edits import signatures
from binlens.api.models import HexAddress, Listing, Page, Result, Scan, Selector
from binlens.api.pages import page_by_address, page_by_offset
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.jobs.state import function_name
from binlens.printable import escape_controls
from binlens.store.analysis import AnalysisView, FunctionRow
from binlens.workspace import Program, Workspace

# the engine's tuple, spelled once, and `signature` (names `signature.apply` gave); pydantic reads it
Source = Literal[(*SOURCES, "signature")]  # type: ignore[valid-type]


class FunctionItem(Result):
    address: HexAddress
    name: str
    size: int
    sources: list[str] = Field(description="How the function was found.")
    blocks: int
    instructions: int
    noreturn: bool
    thunk: str | None = Field(None, description="The import this thunk jumps to.")
    warnings: list[str] | None = Field(
        default=None,
        description="Caveats of this result, e.g. that only heuristics found the function (absent when none).",
        exclude_if=lambda v: not v,
    )


class SignatureName(Result):
    name: str
    score: float = Field(description="The similarity of the match that gave the name (1.0: identical code).")
    reference: str = Field(description="The reference file the name came from.")


class FunctionDetail(FunctionItem):
    end: HexAddress
    symbol: str | None = None
    callers: int
    callees: int
    signature: SignatureName | None = Field(None, description="The name `signature.apply` gave, with its score.")


class FunctionListParams(NeedsAnalysis):
    name: str | None = Field(None, max_length=1024, description="Glob on the function name, e.g. 'str*'.")
    min_size: int | None = Field(None, ge=0, description="Only functions at least this many bytes long.")
    max_size: int | None = Field(None, ge=0, description="Only functions at most this many bytes long.")
    source: Source | None = Field(None, description="Only functions found this way.")
    page: Page = Page()
    scan: Scan = Scan()


class FunctionSelectParams(NeedsAnalysis):
    selector: Selector


class BlockItem(Result):
    start: HexAddress
    end: HexAddress
    size: int
    instructions: int
    terminator: str
    successors: list[HexAddress]


class FunctionBlocksParams(FunctionSelectParams):
    page: Page = Page()


class CfgNode(Result):
    id: HexAddress
    start: HexAddress
    end: HexAddress
    instructions: int
    terminator: str
    entry: bool


class CfgEdge(Result):
    src: HexAddress
    dst: HexAddress
    kind: str


class FunctionCfgParams(FunctionSelectParams):
    format: Literal["json", "dot", "mermaid"] = Field("json", description="json: nodes/edges; dot/mermaid: text.")


class FunctionCfg(Result):
    function: FunctionItem
    nodes: list[CfgNode]
    edges: list[CfgEdge]
    format: str
    text: str | None = Field(None, description="The graph in DOT or Mermaid syntax when asked for.")


def sources_of(prog: Program, f: FunctionRow) -> list[str]:
    """How a function was found, and `signature` when `signature.apply` named it."""
    sig = signatures(prog)
    return [*f.sources, "signature"] if f.address in sig else list(f.sources)


# the sources that are guesses: code addresses taken by instructions or found in data (`pointer`)
# and gaps that start like a function (`prologue`); a start only these found may be no function
HEURISTIC_SOURCES = frozenset({"pointer", "prologue"})
# the loader's tables of code pointers (`pointer` starts that are no guess): what the loader calls
_LISTED_POINTERS = ("init_array", "fini_array", "ctor", "dtor", "opd")


def _listed(prog: Program) -> frozenset[int]:
    """The starts the image's own pointer tables name (`.init_array`, ...), computed once."""
    got = prog.extensions.get("function.listed_pointers")
    if got is None:
        hints = prog.image.function_hints
        got = frozenset(va for key in _LISTED_POINTERS for va in hints.get(key, ()))
        prog.extensions["function.listed_pointers"] = got
    return got


def heuristic_warnings(prog: Program, address: int, sources: list[str] | tuple[str, ...]) -> list[str] | None:
    """`["found by heuristics only: prologue"]` when every source of the function at `address` is a
    heuristic guess (`HEURISTIC_SOURCES`, but a `pointer` the image's own tables list), else None
    (the common case adds nothing to a result)."""
    starts = [s for s in sources if s != "signature"]  # (a name signature.apply gave, not a start)
    if not starts or not set(starts) <= HEURISTIC_SOURCES:
        return None
    if "prologue" not in starts and address in _listed(prog):
        return None
    return [f"found by heuristics only: {', '.join(starts)}"]


def function_item(prog: Program, f: FunctionRow) -> FunctionItem:
    """The list item of one function."""
    sources = sources_of(prog, f)
    return FunctionItem(
        address=hex(f.address),
        name=function_name(prog, f),
        size=f.size,
        sources=sources,
        blocks=f.blocks,
        instructions=f.instructions,
        noreturn=f.noreturn,
        thunk=f.thunk,
        warnings=heuristic_warnings(prog, f.address, sources),
    )


@method("function.list", effect=READ_ONLY)
def function_list(ws: Workspace, p: FunctionListParams, ctx: CallContext) -> Listing[FunctionItem]:
    """List functions in address order, filtered by name glob, size range and source."""
    prog, view = need_view(ws, p, ctx)
    funcs: list[FunctionRow] = view.functions
    if p.source:
        funcs = [f for f in funcs if p.source in sources_of(prog, f)]
    if p.min_size is not None:
        funcs = [f for f in funcs if f.size >= p.min_size]
    if p.max_size is not None:
        funcs = [f for f in funcs if f.size <= p.max_size]
    if p.name:
        pat = p.name
        funcs = [f for f in funcs if fnmatch.fnmatchcase(function_name(prog, f), pat)]
    out, cursor, report = page_by_address(prog, p, funcs, lambda f: f.address, p.page, p.scan)
    items = [function_item(prog, f) for f in out]
    guessed = sum(1 for x in items if x.warnings)
    if guessed:
        ctx.warn(f"{guessed} of these {len(items)} functions were found by heuristics only")
    return Listing[FunctionItem](items=items, next_cursor=cursor, scan=report)


@method("function.get", effect=READ_ONLY)
def function_get(ws: Workspace, p: FunctionSelectParams, ctx: CallContext) -> FunctionDetail:
    """One function by entry address, an address inside it, or name."""
    prog, view = need_view(ws, p, ctx)
    f = select_function(prog, view, p.selector)
    item = function_item(prog, f)
    for w in item.warnings or ():
        ctx.warn(f"function {item.address}: {w}")
    return FunctionDetail(
        **item.model_dump(),
        end=hex(f.address + f.size),
        symbol=f.symbol,
        callers=len({fn for fn, _ in view.callers(f.address)}),
        callees=len({c for _, c in view.callees(f.address)}),
        signature=SignatureName(**sig) if (sig := signatures(prog).get(f.address)) else None,
    )


def _successors(view: AnalysisView, fn: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for s, d, _k in view.edges(fn):
        out.setdefault(s, []).append(d)
    return out


@method("function.blocks", effect=READ_ONLY)
def function_blocks(ws: Workspace, p: FunctionBlocksParams, ctx: CallContext) -> Listing[BlockItem]:
    """The basic blocks of a function in address order, with their successors."""
    prog, view = need_view(ws, p, ctx)
    f = select_function(prog, view, p.selector)
    succ = _successors(view, f.address)
    items = [
        BlockItem(
            start=hex(s),
            end=hex(e),
            size=e - s,
            instructions=n,
            terminator=t,
            successors=[hex(d) for d in succ.get(s, [])],
        )
        for s, e, n, t in view.blocks(f.address)
    ]
    out, cursor = page_by_offset(prog, p, items, p.page)
    return Listing[BlockItem](items=out, next_cursor=cursor)


@method("function.cfg", effect=READ_ONLY)
def function_cfg(ws: Workspace, p: FunctionCfgParams, ctx: CallContext) -> FunctionCfg:
    """The control-flow graph of a function as JSON nodes/edges, DOT or Mermaid."""
    prog, view = need_view(ws, p, ctx)
    f = select_function(prog, view, p.selector)
    nodes = [
        CfgNode(id=hex(s), start=hex(s), end=hex(e), instructions=n, terminator=t, entry=s == f.address)
        for s, e, n, t in view.blocks(f.address)
    ]
    edges = [CfgEdge(src=hex(s), dst=hex(d), kind=k) for s, d, k in view.edges(f.address)]
    item = function_item(prog, f)
    text = None
    if p.format == "dot":
        text = cfg_dot(item.name, nodes, edges)
    elif p.format == "mermaid":
        text = cfg_mermaid(nodes, edges)
    return FunctionCfg(function=item, nodes=nodes, edges=edges, format=p.format, text=text)


_EDGE_STYLE = {
    "conditional_taken": 'color="darkgreen"',
    "conditional_fallthrough": 'color="firebrick"',
    "jump_table": 'color="blue", style="dashed"',
}


def cfg_dot(name: str, nodes: list[CfgNode], edges: list[CfgEdge]) -> str:
    """DOT text of a CFG (block labels: address range and instruction count).

    The function's name is binary data: in the quoted graph ID its control characters are escaped
    (one line, nothing for a terminal to act on), its backslashes doubled and its quotes made `'`,
    so no name can end the ID early and add DOT statements of its own.
    """
    title = escape_controls(name).replace("\\", "\\\\").replace('"', "'")
    lines = [f'digraph "{title}" {{', '  node [shape=box, fontname="monospace"];']
    for n in nodes:
        extra = ", penwidth=2" if n.entry else ""
        lines.append(f'  "{n.id}" [label="{n.start}..{n.end}\\n{n.instructions} insns\\n{n.terminator}"{extra}];')
    for e in edges:
        style = _EDGE_STYLE.get(e.kind, "")
        lines.append(f'  "{e.src}" -> "{e.dst}" [{style + ", " if style else ""}label="{e.kind}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def cfg_mermaid(nodes: list[CfgNode], edges: list[CfgEdge]) -> str:
    """Mermaid flowchart text of a CFG."""
    lines = ["flowchart TD"]
    for n in nodes:
        lines.append(f'  b{n.id[2:]}["{n.start}..{n.end} ({n.instructions} insns)"]')
    for e in edges:
        lines.append(f"  b{e.src[2:]} -->|{e.kind}| b{e.dst[2:]}")
    return "\n".join(lines) + "\n"
