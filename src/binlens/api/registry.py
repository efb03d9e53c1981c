"""The one method registry: `@method` turns a typed function into every surface's operation."""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
import typing
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from binlens import components
from binlens.api.requirements import Requirement, first_missing, is_loopback_address, parse
from binlens.errors import BinlensError, pointer

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_keys, dict_values

    from binlens.workspace import Workspace

log = logging.getLogger("binlens")

READ_ONLY = "read-only"
MUTATION = "mutation"
DESTRUCTIVE = "destructive mutation"
LIFECYCLE = "lifecycle"
EFFECTS = (READ_ONLY, MUTATION, DESTRUCTIVE, LIFECYCLE)
MAX_WARNINGS = 20  # caveats one call collects (`CallContext.warn`)


class CallContext:
    """Per-call context: progress reporting, cancellation, client identity."""

    def __init__(
        self,
        *,
        client: str = "local",
        progress: Callable[[float, float | None, str | None], None] | None = None,
        transport: str = "local",
        protocol_version: str | None = None,
        client_features: frozenset[str] | None = None,
        peer: str | None = None,
        authenticated: bool = False,
    ) -> None:
        self.client = client
        # where the call comes from: the client's network address (a proxy's forwarded-for address
        # where one is named; None for an in-process or stdio caller), and whether it presented the
        # server's token
        self.peer = peer
        self.authenticated = authenticated
        self._progress = progress
        # what the transport knows of the caller: its name (mcp, websocket, local), the protocol
        # version it negotiated (None where it negotiates none) and the client's declared features
        # (MCP client capabilities: sampling, elicitation, roots, ...; None: it declared none)
        self.transport = transport
        self.protocol_version = protocol_version
        self.client_features = client_features
        self._cancelled = threading.Event()
        self._last_progress = 0.0
        # progress as REA words it: monotonic, at most one intermediate update per 100 ms, one
        # terminal update (`finish`), a total only when the method gave one
        self._progress_lock = threading.Lock()
        self._high = 0.0  # the most work reported done so far (updates never go back)
        self._total: float | None = None
        self._terminal_sent = False
        self._sent_any = False  # (a call that reported no progress gets no terminal update either)
        self._depth = 0  # nested invokes on this context (batch, evidence.record): the outermost finishes
        # the byte budget of the running call's result (set by `invoke`): methods that build big
        # results `charge` it as they go; batch.execute checks it before it commits anything
        self.response_budget: int | None = None
        self._charged = 0
        # caveats of the call's result (heuristic guesses, parts of the program the analysis left
        # out): the one-shot CLI's envelope carries them as `warnings`
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        """Note a caveat of this call's result (each once, at most MAX_WARNINGS, each at most 300
        characters)."""
        message = message if len(message) <= 300 else message[:297] + "..."
        if message not in self.warnings and len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)

    @contextmanager
    def budget(self, limit: int) -> typing.Iterator[None]:
        """Count `charge`s against `limit` for one call (a nested call counts its own result)."""
        outer = self.response_budget, self._charged
        self.response_budget, self._charged = limit, 0
        try:
            yield
        finally:
            self.response_budget, self._charged = outer

    def charge(self, nbytes: int) -> None:
        """Count `nbytes` (a lower bound) of the result being built; fail with `response_too_large`
        as soon as the call's budget is passed, before the rest is built."""
        if self.response_budget is None:
            return
        self._charged += nbytes
        if self._charged > self.response_budget:
            raise too_large(self.response_budget, self._charged)

    @property
    def trusted(self) -> bool:
        """Whether the caller is this machine (in-process, stdio, a loopback peer) or authenticated."""
        return self.peer is None or self.authenticated or is_loopback_address(self.peer)

    def cancel(self) -> None:
        """Ask the running method to stop at its next check."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check_cancelled(self) -> None:
        """Raise `cancelled` if the client gave up on this call."""
        if self._cancelled.is_set():
            raise BinlensError("cancelled", "the request was cancelled")

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress and check cancellation. What reaches the client never goes back (a
        smaller `done` is raised to the most reported so far), intermediate updates come at most
        once per 100 ms, and the update that reaches `total` is sent once."""
        self.check_cancelled()
        if self._progress is None:
            return
        with self._progress_lock:
            if self._terminal_sent:
                return
            done = max(float(done), self._high)
            self._high = done
            self._total = total
            now = time.monotonic()
            if total is not None and done >= total:
                self._terminal_sent = True
            elif now - self._last_progress < 0.1:
                return
            self._last_progress = now
            self._sent_any = True
        self._progress(done, total, message)

    def finish(self, outcome: str) -> None:
        """Send the terminal progress update of a call that reported progress (`outcome`: done,
        cancelled, timeout, failed): on success with a known total, done = total; otherwise the
        work reported so far, and the total only if the method gave one."""
        if self._progress is None:
            return
        with self._progress_lock:
            if self._terminal_sent or not self._sent_any:
                return
            self._terminal_sent = True
            total = self._total
            done = total if outcome == "done" and total is not None else self._high
        self._progress(done, total, outcome)


@dataclass(frozen=True)
class MethodSpec:
    """One registered method."""

    name: str
    effect: str
    summary: str
    description: str
    params_model: type[BaseModel]
    result_type: Any
    func: Callable[..., Any]
    long_running: bool = False
    # what it needs to run here (`requirements.py`); a mutation needs a writable server
    requires: tuple[Requirement, ...] = ()

    @property
    def domain(self) -> str:
        return self.name.rsplit(".", 1)[0]

    @property
    def operation(self) -> str:
        return self.name.rsplit(".", 1)[1]

    @property
    def mutates(self) -> bool:
        return self.effect in (MUTATION, DESTRUCTIVE)

    @cached_property
    def _adapter(self) -> TypeAdapter[Any]:
        """The result type's serializer, built on first use (building 65 of them cost ~20 ms at import)."""
        with _SCHEMA_LOCK:
            return TypeAdapter(self.result_type)

    def input_schema(self) -> dict[str, Any]:
        """The params model's JSON Schema, `$ref`s inlined."""
        with _SCHEMA_LOCK:
            return inline_schema(self.params_model.model_json_schema())

    def output_schema(self) -> dict[str, Any]:
        """The result type's JSON Schema (serialization mode), `$ref`s inlined."""
        adapter = self._adapter
        with _SCHEMA_LOCK:
            return inline_schema(adapter.json_schema(mode="serialization"))


# pydantic builds schemas and serializers through caches shared by every model (generic models are
# parametrised once), which are not safe across threads: two concurrent first `interface.get` calls
# failed inside pydantic ("this is a bug!"). Building them one at a time costs nothing after the first.
_SCHEMA_LOCK = threading.RLock()


class Registry(dict[str, MethodSpec]):
    """Method name -> MethodSpec, the domains imported when first needed.

    A name is looked up in the module its namespace names first (`function.list` ->
    `binlens.api.function`), then in every domain; listing the methods imports them all. A
    one-shot CLI command imports the two or three domains it calls, not all of them (~60 ms of
    its ~0.3 s on a small program); a server lists them all at its first `tools/list`."""

    complete = False

    def load_all(self) -> None:
        """Import every domain module of `binlens.api` (`components.DOMAINS`)."""
        if self.complete:
            return
        for name in components.DOMAINS:
            importlib.import_module(f"binlens.api.{name}")
        self.complete = True

    def _find(self, name: object) -> bool:
        if dict.__contains__(self, name):
            return True
        if self.complete or not isinstance(name, str):
            return False
        namespace = name.partition(".")[0]
        if namespace in components.DOMAINS:
            importlib.import_module(f"binlens.api.{namespace}")
        if not dict.__contains__(self, name):
            self.load_all()
        return dict.__contains__(self, name)

    def __contains__(self, name: object) -> bool:
        return self._find(name)

    def __getitem__(self, name: str) -> MethodSpec:
        self._find(name)
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return dict.__getitem__(self, name) if self._find(name) else default

    def __iter__(self) -> typing.Iterator[str]:
        self.load_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self.load_all()
        return dict.__len__(self)

    def keys(self) -> dict_keys[str, MethodSpec]:
        self.load_all()
        return dict.keys(self)

    def values(self) -> dict_values[str, MethodSpec]:
        self.load_all()
        return dict.values(self)

    def items(self) -> dict_items[str, MethodSpec]:
        self.load_all()
        return dict.items(self)


REGISTRY = Registry()


def method(
    name: str,
    *,
    effect: str,
    summary: str | None = None,
    long_running: bool = False,
    requires: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `func(ws, params, ctx?)` as the dotted method `name`.

    The params model and result type come from the function's annotations; the docstring's
    first paragraph, as one line, is the summary unless given. `requires` names what the method needs to run
    (`provider:<id>`, `provider-kind:<kind>`, `permission:<name>`, `client:<feature>`; a mutation needs `writable`
    without saying so): while one is missing the method stays in the catalog and a call answers
    `unavailable` (`read_only` for `writable`) with the reason and the remedy.
    """
    if effect not in EFFECTS:
        raise ValueError(f"unknown effect {effect!r}")
    if name.count(".") != 1:
        raise ValueError(f"method name {name!r} must be 'domain.verb'")
    if isinstance(requires, str):
        raise ValueError("requires is a tuple of requirements")
    needs = tuple(parse(text) for text in requires)
    if effect in (MUTATION, DESTRUCTIVE) and all(r.kind != "writable" for r in needs):
        needs = (parse("writable"), *needs)

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func)
        arg_names = list(func.__code__.co_varnames[: func.__code__.co_argcount])
        params_model = hints[arg_names[1]]
        result_type = hints["return"]
        doc = (func.__doc__ or "").strip()
        first = summary or " ".join(doc.split("\n\n", 1)[0].split())
        if not first:
            raise ValueError(f"method {name} needs a summary or docstring")
        if dict.__contains__(REGISTRY, name):  # (not `in`: that would import the other domains)
            raise ValueError(f"method {name} registered twice")
        REGISTRY[name] = MethodSpec(
            name=name,
            effect=effect,
            summary=first,
            description=doc or first,
            params_model=params_model,
            result_type=result_type,
            func=func,
            long_running=long_running,
            requires=needs,
        )
        return func

    return register


_TAG_PARTS = {"str", "int", "float", "bool", "list", "dict", "none", "bytes", "lax-or-strict", "strict"}


def _loc_to_pointer(loc: tuple[Any, ...]) -> str:
    parts = [p for p in loc if not (isinstance(p, str) and ("[" in p or p in _TAG_PARTS or p[:1].isupper()))]
    return pointer(["params", *parts])


def validation_error(err: ValidationError) -> BinlensError:
    """Turn a pydantic error into `invalid_argument` with a JSON pointer into the request."""
    errors = err.errors(include_url=False, include_context=False, include_input=False)
    items = []
    for e in errors:
        msg = e["msg"].removeprefix("Value error, ")
        items.append({"target": _loc_to_pointer(tuple(e["loc"])), "message": msg, "type": e["type"]})
    first = items[0]
    return BinlensError(
        "invalid_argument",
        f"{first['target'] or '/params'}: {first['message']}",
        target=first["target"] or "/params",
        details={"errors": items},
    )


def _server_built(err: ValidationError) -> bool:
    """Did `err` come from a result model (named by `err.title`), which the server fills itself?"""
    from binlens.api.models import Params, Result

    def names(cls: type[BaseModel]) -> set[str]:
        out: set[str] = set()
        for sub in cls.__subclasses__():
            out.add(sub.__name__)
            out |= names(sub)
        return out

    return err.title in names(Result) and err.title not in names(Params)


def lookup(name: Any) -> MethodSpec:
    """Find a method by name or raise `not_found` pointing at `/method`."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise BinlensError(
            "not_found",
            f"unknown method {name!r}; interface.get lists them",
            target="/method",
        )
    return REGISTRY[name]


def invoke(
    ws: Workspace,
    name: str,
    params: Any,
    ctx: CallContext | None = None,
    *,
    max_response_bytes: int | None = None,
) -> Any:
    """Validate, run and serialise one call; raises BinlensError on any failure."""
    spec = lookup(name)
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BinlensError("invalid_argument", "params must be an object", target="/params")
    ctx = ctx or CallContext()
    ctx._depth += 1
    try:
        if ctx._depth == 1:  # (the outermost call counts as running on its program: closing it drains)
            from binlens.api.calls import tracked

            with tracked(ws, spec, params, ctx):
                data = _invoke(ws, spec, params, ctx, max_response_bytes)
        else:
            data = _invoke(ws, spec, params, ctx, max_response_bytes)
    except BinlensError as err:
        if ctx._depth == 1:
            ctx.finish(err.code if err.code in ("cancelled", "timeout") else "failed")
        raise
    finally:
        ctx._depth -= 1
    if ctx._depth == 0:
        ctx.finish("done")
    return data


def _invoke(ws: Workspace, spec: MethodSpec, params: Any, ctx: CallContext, max_response_bytes: int | None) -> Any:
    """`invoke` of a looked-up method on its context."""
    name = spec.name
    if getattr(ws, "stopping", False):  # (session.shutdown accepted: no new work)
        raise BinlensError("unavailable", "the server is shutting down", details={"reason": "stopping"})
    unmet = first_missing(ws, spec.requires, ctx)
    if unmet is not None:
        raise unmet[0].error(name, unmet[1])
    try:
        parsed = spec.params_model.model_validate(params)
    except ValidationError as err:
        raise validation_error(err) from None
    budget = max_response_bytes if max_response_bytes is not None else ws.limits.max_response_bytes
    try:
        with ctx.budget(budget):
            if spec.long_running:
                with ws.work_slot():
                    result = _run(spec, ws, parsed, ctx)
            else:
                result = _run(spec, ws, parsed, ctx)
    except BinlensError:
        raise
    except ValidationError as err:  # a nested model built from client data
        if _server_built(err):  # a result model the method filled from the file: not the client's doing
            log.error("internal error in %s: %s", name, err)
            raise BinlensError("internal", f"internal error in {name}; see the server log") from None
        raise validation_error(err) from None
    except Exception:  # noqa: BLE001 - nothing internal crosses the wire
        log.exception("internal error in %s", name)
        raise BinlensError("internal", f"internal error in {name}; see the server log") from None
    # Counted on the built objects before any copy is serialised: a page of 1,000 items that share
    # one 1 MiB string is a few MB of references but GBs of JSON, and is refused after a few items.
    at_least = json_size_at_least(result, budget)
    if at_least > budget:
        raise too_large(budget, at_least)
    data = spec._adapter.dump_python(result, mode="json")
    size = response_size(data)
    if size > budget:
        raise response_too_large(size, budget)
    return data


def response_size(data: Any) -> int:
    """The bytes of `data` (JSON-ready) as compact JSON: what the response budget counts."""
    return len(json.dumps(data, separators=(",", ":")))


def response_too_large(
    size: int, budget: int, *, at_least: bool = False, reference: dict[str, str] | None = None
) -> BinlensError:
    """The `response_too_large` error of a `size`-byte result (`at_least`: counted so far) over
    `budget`; `reference`: the evidence that retained the result (`details.evidence_reference`)."""
    if at_least:
        return too_large(budget, size)
    details: dict[str, Any] = {"limit": budget, "size": size, "size_at_least": size}
    hint = "ask for less (a smaller page.limit or range)"
    if reference is not None:
        details["evidence_reference"] = reference
        hint = f"the result is retained as {reference['evidence_id']}: evidence.export writes it to a file"
    return BinlensError(
        "response_too_large",
        f"the result is {size} bytes, over the {budget}-byte response budget; {hint}",
        details=details,
    )


def retained_reference(data: Any) -> dict[str, str] | None:
    """`{evidence_id, ledger}` when `data` is a result evidence.record retained, else None."""
    if not isinstance(data, dict):
        return None
    eid, evidence = data.get("evidence_id"), data.get("evidence")
    if isinstance(eid, str) and isinstance(evidence, dict) and isinstance(evidence.get("ledger"), str):
        return {"evidence_id": eid, "ledger": evidence["ledger"]}
    return None


def frame_size(message: Any) -> int:
    """The UTF-8 bytes of `message` as the transports write it (compact JSON, non-ASCII as is)."""
    return len(json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


def too_large(budget: int, at_least: int) -> BinlensError:
    """`response_too_large` for a result known to pass `at_least` bytes."""
    return BinlensError(
        "response_too_large",
        f"the result is over {at_least} bytes, past the {budget}-byte response budget; ask for less "
        "(a smaller page.limit or range)",
        details={"limit": budget, "size_at_least": at_least},
    )


def json_size_at_least(value: Any, budget: int) -> int:
    """A lower bound of `value`'s compact JSON size, counted until it passes `budget`.

    Strings count their characters and quotes, other leaves but None one byte, model keys and
    punctuation nothing, so a result under the bound never fails here; the walk stops as soon as the count
    is over `budget`, without serialising anything.
    """
    total = 0
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, (bytes, bytearray)):
            total += len(v)
        elif isinstance(v, BaseModel):
            stack.extend(getattr(v, name, None) for name in type(v).model_fields)
            continue
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
            continue
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
            continue
        elif v is not None:  # (None may be left out of the document)
            total += 1
        if total > budget:
            break
    return total


def program_identity(ws: Workspace, name: str, params: Any, result: Any = None) -> dict[str, Any] | None:
    """The identity of the program a call concerned (SPEC: carried by every such response), or None.

    A method concerns a program when its params take `program` (named, or the only open one), or
    when it returns one (program.open).
    """
    spec = REGISTRY.get(name)
    if spec is None:
        return None
    if "program" in spec.params_model.model_fields:
        ref = params.get("program") if isinstance(params, dict) else None
        prog = ws.programs.get(ref) if isinstance(ref, str) else None
        if prog is None and ref is None and len(ws.programs) == 1:
            prog = next(iter(ws.programs.values()))
        if prog is not None:
            return prog.identity
    if isinstance(result, dict) and isinstance(result.get("identity"), dict):
        return result["identity"]
    return None


def _run(spec: MethodSpec, ws: Workspace, parsed: BaseModel, ctx: CallContext) -> Any:
    if spec.func.__code__.co_argcount >= 3:
        return spec.func(ws, parsed, ctx)
    return spec.func(ws, parsed)


def inline_schema(schema: dict[str, Any], max_depth: int = 10) -> dict[str, Any]:
    """Inline `$defs` references (no recursive refs) so clients see one flat document."""
    defs = schema.get("$defs", {})

    def walk(node: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                key = ref.split("/")[-1]
                if key in stack:
                    raise ValueError(f"recursive schema reference {key}")
                merged = {k: v for k, v in node.items() if k != "$ref"}
                target = walk(defs[key], (*stack, key))
                return {**target, **merged}
            return {k: walk(v, stack) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v, stack) for v in node]
        return node

    out = walk(schema, ())
    if _depth(out) > max_depth * 2 + 2:  # properties/items add one level per model level
        raise ValueError("schema nests too deeply")
    return out


def _depth(node: Any) -> int:
    if isinstance(node, dict):
        return 1 + max((_depth(v) for v in node.values()), default=0)
    if isinstance(node, list):
        return 1 + max((_depth(v) for v in node), default=0)
    return 0
