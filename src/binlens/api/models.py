"""Shared request/response shapes: strict params, selectors, pages, scans, listings."""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

AddressText = Annotated[
    str,
    Field(
        min_length=1,
        max_length=512,
        description="A hexadecimal address like '0x401000', a symbol name, or 'name+0x10'.",
    ),
]
HexAddress = Annotated[str, Field(description="Hexadecimal virtual address, e.g. '0x401000'.")]
ProgramRef = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        description="Program handle from program.open; may be omitted while exactly one program is open.",
    ),
]


class Params(BaseModel):
    """Base of every method's input: unknown fields and type coercions are rejected."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False, defer_build=True)


class Result(BaseModel):
    """Base of every method's output."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


class Page(Params):
    """Page request: `limit` items after the opaque `cursor`."""

    limit: int = Field(100, ge=1, le=1000, description="Items per page (1..1000).")
    cursor: str | None = Field(None, max_length=4096, description="Opaque cursor from a previous page.")


class AddressRange(Params):
    """A half-open virtual address range [start, end)."""

    start: AddressText
    end: AddressText


class Scan(Params):
    """Bounds of an address-ordered scan."""

    range: AddressRange | None = Field(None, description="Only scan this address range.")
    timeout_ms: int = Field(1000, ge=100, le=60000, description="Stop and return a partial page after this.")


StopReason = Literal["limit", "timeout", "range_end"]


class ScanReport(Result):
    """How far a scan got."""

    complete: bool
    stop_reason: StopReason
    scanned_to: HexAddress | None = None


class Selector(Params):
    """Select one thing by `address` or by `name` (a symbol, optionally `name+0x10`)."""

    address: AddressText | None = None
    name: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Selector:
        if (self.address is None) == (self.name is None):
            raise ValueError("give exactly one of 'address' or 'name'")
        return self


T = TypeVar("T")


class Listing(Result, Generic[T]):
    """A page of items plus the cursor of the next page (null at the end)."""

    items: list[T]
    next_cursor: str | None = None
    scan: ScanReport | None = None
