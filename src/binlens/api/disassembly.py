"""disassembly.*: a range as a second disassembler (a provider) decodes it, checked against binlens's own decode."""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import Field, model_validator

from binlens.api.analysis import select_function
from binlens.api.instruction import decode_range, decoder, thumb_spans
from binlens.api.models import AddressRange, HexAddress, Params, ProgramRef, Result, Selector
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of
from binlens.providers import registry as providers
from binlens.providers.base import DisassembledInstruction, DisassemblerSession

MAX_RANGE = 64 * 1024
MAX_LISTED = 100  # addresses listed per kind of disagreement

ProviderChoice = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z][a-z0-9_-]*$",
        description="'auto' (the first available disassembler in provider.list order) or a provider id.",
    ),
]


class DisassemblyGetParams(Params):
    """What to disassemble (a function or a range) and with which provider."""

    program: ProgramRef | None = None
    selector: Selector | None = Field(None, description="A function (its extent; waits for the analysis).")
    range: AddressRange | None = Field(None, description="An address range [start, end) of at most 64 KiB.")
    provider: ProviderChoice = "auto"
    timeout_ms: int = Field(10000, ge=100, le=120000, description="How long the provider (and the analysis) may take.")

    @model_validator(mode="after")
    def _one_place(self) -> DisassemblyGetParams:
        if (self.selector is None) == (self.range is None):
            raise ValueError("give exactly one of 'selector' or 'range'")
        return self


class ProviderBinding(Result):
    """The provider that answered."""

    id: str
    version: str | None = None


class ProviderInstruction(Result):
    """One instruction as the provider decoded it."""

    address: HexAddress
    size: int
    bytes: str = Field(description="Hex bytes.")
    text: str = Field(description="The provider's text of the instruction (objdump: Intel syntax on x86).")


class Agreement(Result):
    """Where the provider's instruction starts and binlens's differ."""

    agree: bool = Field(description="Both decoders start instructions at the same addresses with the same sizes.")
    compared: int = Field(description="Instruction starts of binlens's decode in the range.")
    binlens_only: list[HexAddress] = Field(description="Starts only binlens decodes (at most 100).")
    provider_only: list[HexAddress] = Field(description="Starts only the provider decodes (at most 100).")
    size_differs: list[HexAddress] = Field(description="Starts both decode with different sizes (at most 100).")


class DisassemblyResult(Result):
    """A range as a disassembler provider decodes it, checked against binlens's decode."""

    provider: ProviderBinding
    start: HexAddress
    end: HexAddress
    instructions: list[ProviderInstruction]
    agreement: Agreement


def _bounds(ws: Any, p: DisassemblyGetParams, ctx: CallContext) -> tuple[Any, int, int]:
    """The program and the range to disassemble."""
    prog = ws.program(p.program)
    if p.range is not None:
        start = prog.resolve(p.range.start, "/params/range/start")
        end = prog.resolve(p.range.end, "/params/range/end")
        target = "/params/range/end"
    else:
        assert p.selector is not None
        view = analysis_of(prog).require(ctx, wait=True, timeout_s=p.timeout_ms / 1000)
        f = select_function(prog, view, p.selector)
        start, end, target = f.address, f.address + f.size, "/params/selector"
        thumb_spans(decoder(prog), view, [(start, end)])
    if end <= start:
        raise BinlensError("invalid_argument", "the range is empty (end <= start)", target=target)
    if end - start > MAX_RANGE:
        raise BinlensError(
            "invalid_argument",
            f"{end - start} bytes is over the {MAX_RANGE}-byte limit; ask for a smaller range",
            target=target,
            details={"limit": MAX_RANGE},
        )
    return prog, start, end


def _agreement(ours: dict[int, int], theirs: list[DisassembledInstruction]) -> Agreement:
    seen = {i.address: len(i.data) for i in theirs if i.text != "(bad)"}
    only_ours = sorted(set(ours) - set(seen))
    only_theirs = sorted(set(seen) - set(ours))
    differs = sorted(a for a in set(ours) & set(seen) if ours[a] != seen[a])
    return Agreement(
        agree=not (only_ours or only_theirs or differs),
        compared=len(ours),
        binlens_only=[hex(a) for a in only_ours[:MAX_LISTED]],
        provider_only=[hex(a) for a in only_theirs[:MAX_LISTED]],
        size_differs=[hex(a) for a in differs[:MAX_LISTED]],
    )


@method("disassembly.get", effect=READ_ONLY, long_running=True, requires=("provider-kind:disassembler",))
def disassembly_get(ws: Any, p: DisassemblyGetParams, ctx: CallContext) -> DisassemblyResult:
    """A function or range as a disassembler provider (objdump) decodes it, and where it disagrees with binlens.

    Both sides decode the range linearly from its start, so the comparison checks the decoders,
    not the analysis; bytes that are not code make both disagree. The provider runs in its own
    process: a crash, a hang past `timeout_ms` or a memory blow-up is this call's error, and the
    next call starts it again.
    """
    provider, availability = providers.choose(p.provider, "disassembler")
    prog, start, end = _bounds(ws, p, ctx)
    session = cast(DisassemblerSession, providers.session(prog, provider))
    theirs = session.disassemble(start, end, timeout=p.timeout_ms / 1000, ctx=ctx)
    ours = {i.address: i.size for i in decode_range(prog, decoder(prog), start, end) if i.flow != "data"}
    return DisassemblyResult(
        provider=ProviderBinding(id=provider.id, version=availability.version),
        start=hex(start),
        end=hex(end),
        instructions=[
            ProviderInstruction(address=hex(i.address), size=len(i.data), bytes=i.data.hex(), text=i.text)
            for i in theirs
        ],
        agreement=_agreement(ours, theirs),
    )
