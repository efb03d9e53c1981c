"""batch.execute: run 1..1000 method calls as one atomic unit or item by item."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import Field

from binlens.api.edits import database_busy, invalidate, refresh, settle_analysis, store
from binlens.api.models import Params, ProgramRef, Result
from binlens.api.registry import LIFECYCLE, MUTATION, CallContext, invoke, lookup, method
from binlens.errors import BinlensError


class BatchItem(Params):
    """One call in a batch."""

    method: Annotated[str, Field(min_length=3, max_length=128, description="A method name, e.g. 'comment.create'.")]
    params: dict[str, Any] = Field(default_factory=dict)


class BatchParams(Params):
    """Up to 1000 calls and how to commit them."""

    program: ProgramRef | None = Field(None, description="Program of every item that does not name its own.")
    mode: Literal["all_or_none", "per_item"] = Field(
        "all_or_none",
        description="all_or_none: one transaction, rolled back at the first error; per_item: each item commits "
        "on its own and reports its outcome.",
    )
    include_results: bool = Field(True, description="Return each item's result (false keeps big batches small).")
    items: list[BatchItem] = Field(min_length=1, max_length=1000)


class ItemOutcome(Result):
    """One batch item's result or error."""

    index: int
    method: str
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None


class BatchResult(Result):
    """The outcome of a batch."""

    batch_id: str
    mode: Literal["all_or_none", "per_item"]
    succeeded: int
    failed: int
    items: list[ItemOutcome]


def _retarget(err: BinlensError, index: int) -> BinlensError:
    target = err.target or ""
    prefix = f"/params/items/{index}"
    if target.startswith("/params"):
        target = prefix + target
    elif target.startswith("/method"):
        target = prefix + "/method"
    else:
        target = prefix
    return BinlensError(
        err.code, f"item {index}: {err.message}", target=target, details={**err.details, "index": index}
    )


def _check(p: BatchParams) -> None:
    for i, it in enumerate(p.items):
        if it.method == "batch.execute":
            raise BinlensError("invalid_argument", "batches do not nest", target=f"/params/items/{i}/method")
        try:
            spec = lookup(it.method)
        except BinlensError as err:
            raise _retarget(err, i) from None
        if spec.effect == LIFECYCLE:
            raise BinlensError(
                "invalid_argument",
                f"{it.method} opens or closes programs and cannot run in a batch",
                target=f"/params/items/{i}/method",
            )
        if p.mode == "all_or_none" and "program" in it.params and it.params["program"] != p.program:
            raise BinlensError(
                "invalid_argument",
                "an all_or_none batch acts on one program: give it as the batch's 'program'",
                target=f"/params/items/{i}/params/program",
            )


def _params(p: BatchParams, it: BatchItem) -> dict[str, Any]:
    params = dict(it.params)
    if p.program is not None and "program" not in params:
        params["program"] = p.program
    return params


# methods whose edits consult the analysis (which must be saved before the batch's transaction opens)
_CONSULT_ANALYSIS = frozenset({"function.create", "function.delete"})


@method("batch.execute", effect=MUTATION)
def batch_execute(ws: Any, p: BatchParams, ctx: CallContext) -> BatchResult:
    """Run up to 1000 calls: all_or_none rolls everything back on the first error; per_item reports each."""
    _check(p)
    prog = ws.program(p.program)
    st = store(prog)
    if st.in_atomic_batch:
        raise BinlensError("invalid_argument", "batches do not nest", target="/params")
    batch_id = "b_" + uuid.uuid4().hex[:16]
    outcomes: list[ItemOutcome] = []
    refresh(prog)
    if p.mode == "all_or_none":
        if any(it.method in _CONSULT_ANALYSIS for it in p.items):
            settle_analysis(prog, ctx)  # (before the batch's transaction: see `settle_analysis`)
        try:
            with database_busy(), st.atomic_batch(batch_id):
                for i, it in enumerate(p.items):
                    ctx.progress(i, len(p.items), it.method)
                    try:
                        result = invoke(ws, it.method, _params(p, it), ctx)
                    except BinlensError as err:
                        raise _retarget(err, i) from None
                    outcomes.append(ItemOutcome(index=i, method=it.method, ok=True, result=_keep(p, result)))
        except BaseException as err:
            invalidate(prog)
            refresh(prog)
            if isinstance(err, BinlensError):
                err.details["rolled_back"] = True
            raise
        refresh(prog)
        return BatchResult(batch_id=batch_id, mode=p.mode, succeeded=len(outcomes), failed=0, items=outcomes)
    failed = 0
    with st.tagged_batch(batch_id):
        for i, it in enumerate(p.items):
            ctx.progress(i, len(p.items), it.method)
            try:
                result = invoke(ws, it.method, _params(p, it), ctx)
                outcomes.append(ItemOutcome(index=i, method=it.method, ok=True, result=_keep(p, result)))
            except BinlensError as err:
                failed += 1
                outcomes.append(ItemOutcome(index=i, method=it.method, ok=False, error=_retarget(err, i).to_dict()))
    return BatchResult(batch_id=batch_id, mode=p.mode, succeeded=len(outcomes) - failed, failed=failed, items=outcomes)


def _keep(p: BatchParams, result: Any) -> Any:
    return result if p.include_results else None
