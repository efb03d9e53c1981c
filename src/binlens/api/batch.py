"""batch.execute: run 1..1000 method calls as one atomic unit or item by item."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import Field

from binlens.api.edits import database_busy, invalidate, refresh, settle_analysis, store
from binlens.api.models import Params, ProgramRef, Result
from binlens.api.registry import (
    LIFECYCLE,
    MUTATION,
    CallContext,
    invoke,
    lookup,
    method,
    response_size,
    response_too_large,
)
from binlens.errors import BinlensError
from binlens.workspace import Workspace


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
_CONSULT_ANALYSIS = frozenset({"function.create", "function.delete", "flow_override.patch"})


class _Tally:
    """The running size of a batch's response against the call's budget.

    Each item's outcome is counted as it is made, so a batch that cannot fit is known before it
    commits (all_or_none) and before it holds more than one item's result past the budget.
    """

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.size = 0

    def add(self, outcome: ItemOutcome) -> None:
        """Count one item's outcome (with the comma that separates it from the next)."""
        if self.budget is not None:
            self.size += response_size(outcome.model_dump(mode="json")) + 1

    @property
    def over(self) -> bool:
        """Whether the outcomes counted so far already exceed the budget."""
        return self.budget is not None and self.size > self.budget

    def check(self, result: BatchResult) -> None:
        """Raise `response_too_large` when the whole `result` does not fit."""
        if self.budget is None:
            return
        size = response_size(result.model_dump(mode="json"))
        if size > self.budget:
            raise response_too_large(size, self.budget)


@method("batch.execute", effect=MUTATION)
def batch_execute(ws: Workspace, p: BatchParams, ctx: CallContext) -> BatchResult:
    """Run up to 1000 calls: all_or_none rolls everything back on the first error; per_item reports each.

    The response must fit the call's byte budget. all_or_none measures it inside its transaction,
    so a batch whose response is too large fails with `response_too_large` and commits nothing.
    per_item commits each item as it runs; when the outcomes do not fit it still runs every item,
    keeps no more results once over, and fails with `response_too_large` whose details say
    `committed: true`, how many items succeeded and failed, and the `batch_id` (journal.list
    filters by it).
    """
    _check(p)
    prog = ws.program(p.program)
    st = store(prog)
    if st.in_atomic_batch:
        raise BinlensError("invalid_argument", "batches do not nest", target="/params")
    batch_id = "b_" + uuid.uuid4().hex[:16]
    outcomes: list[ItemOutcome] = []
    tally = _Tally(ctx.response_budget)
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
                    tally.add(outcomes[-1])
                    if tally.over:
                        raise response_too_large(tally.size, tally.budget or 0, at_least=True)
                out = BatchResult(batch_id=batch_id, mode=p.mode, succeeded=len(outcomes), failed=0, items=outcomes)
                tally.check(out)  # (inside the transaction: a response that cannot be sent commits nothing)
        except BaseException as err:
            invalidate(prog)
            refresh(prog)
            if isinstance(err, BinlensError):
                err.details["rolled_back"] = True
            raise
        refresh(prog)
        return out
    failed = 0
    with st.tagged_batch(batch_id):
        for i, it in enumerate(p.items):
            ctx.progress(i, len(p.items), it.method)
            try:
                result = invoke(ws, it.method, _params(p, it), ctx)
                outcome = ItemOutcome(index=i, method=it.method, ok=True, result=_keep(p, result))
            except BinlensError as err:
                failed += 1
                outcome = ItemOutcome(index=i, method=it.method, ok=False, error=_retarget(err, i).to_dict())
            if not tally.over:  # (past the budget the response is an error: the outcomes are not kept)
                tally.add(outcome)
                outcomes.append(outcome)
    succeeded = len(p.items) - failed
    out = BatchResult(batch_id=batch_id, mode=p.mode, succeeded=succeeded, failed=failed, items=outcomes)
    try:
        if tally.over:
            raise response_too_large(tally.size, tally.budget or 0, at_least=True)
        tally.check(out)
    except BinlensError as err:
        err.details.update(committed=True, batch_id=batch_id, succeeded=succeeded, failed=failed)
        raise
    return out


def _keep(p: BatchParams, result: Any) -> Any:
    return result if p.include_results else None
