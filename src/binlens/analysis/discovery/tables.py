"""The explorer's indirect jumps: each jump's case targets asked of the ISA's resolver once, the
paths (recorded predecessors) a resolver is given, and the retry of jumps that failed on every path
known so far. `Explorer` inherits these; the state they read and change is the explorer's own."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Chunk


class SwitchResolution:
    """The jump-table half of `Explorer` (its attributes are set by `Explorer.__init__`)."""

    chunks: dict[int, Chunk]
    pred: dict[int, int]
    jpred: dict[int, int]
    cpred: dict[int, int] | None
    cond_first: bool
    jt: dict[int, list[int]]
    unguarded: set[int]
    unresolved: dict[int, int]
    gotos: list[tuple[int, int, list[int]]]
    _jump_tables: Callable[[int, int, list[tuple[int, int]]], tuple[list[int], bool]] | None
    _retried: dict[int, tuple] | None

    def case_targets(self, chunk_start: int, last: int) -> list[int]:
        """The case targets of the indirect jump at `last` (in the chunk at `chunk_start`), asked of
        the resolver once; one it cannot resolve yet is retried as more paths are recorded."""
        t = self.jt.get(last)
        if t is None:
            guarded = True
            t = []
            if self._jump_tables is not None:
                t, guarded = self._resolve_table(chunk_start, last)
            self.jt[last] = t
            if not t:
                self.unresolved[last] = chunk_start  # retried once more predecessors are known
            if not guarded:
                self.unguarded.add(last)
        return t

    def trial_cases(self, chunk_start: int, last: int) -> list[int]:
        """Case targets of the bounded table behind the jump at `last`, for a heuristic trial.

        A trial decodes code nothing has reached yet, so the recorded path may be short: an
        answer without a bound check is not kept (the descent that reaches the jump for real
        resolves it again), a bounded one is."""
        t = self.jt.get(last)
        if t is not None:
            return [] if last in self.unguarded else t
        if self._jump_tables is None:
            return []
        t, guarded = self._resolve_table(chunk_start, last)
        if not (t and guarded):
            return []
        self.jt[last] = t
        self.unresolved.pop(last, None)
        return t

    def retry_tables(self) -> list[int]:
        """Resolve again the jump tables that failed; returns the new case targets to walk."""
        out: list[int] = []
        if self._jump_tables is None:
            return out
        memo = self._retried
        for last, chunk_start in list(self.unresolved.items()):
            if memo is not None:
                # the resolvers read only the recorded paths (and fixed bytes): a jump whose paths
                # did not change since its last failure fails again (busybox-mips: 47.5k retries)
                key = self._path_key(chunk_start)
                if memo.get(last) == key:
                    continue
                memo[last] = key
            t, guarded = self._resolve_table(chunk_start, last)
            if t:
                del self.unresolved[last]
                self.jt[last] = t
                if not guarded:
                    self.unguarded.add(last)
                out.extend(t)
        return out

    def _path_key(self, chunk_start: int) -> tuple:
        """Everything `_resolve_table` reads of the recorded graph for the jump in `chunk_start`."""
        key: tuple = (len(self.gotos), self.pred.get(chunk_start), tuple(self._pred_chain(chunk_start)))
        if self.cpred is not None:
            key += (tuple(self._pred_chain(chunk_start, jump_first=True)),)
            if self.cond_first:
                key += (tuple(self._pred_chain(chunk_start, cond_first=True)),)
        return key

    def _resolve_table(self, chunk_start: int, last: int) -> tuple[list[int], bool]:
        """Ask the resolver along the recorded path; on AArch64 also along the path that prefers
        jumps (a loop's entry edge rather than its back edge, where a hoisted table address is set)."""
        resolve = self._jump_tables
        if resolve is None:  # (the callers ask only when there is a resolver)
            return [], True
        slice_start = self.pred.get(chunk_start, chunk_start)
        chain = self._pred_chain(chunk_start)
        t, guarded = resolve(slice_start, last, chain)
        if not t and self.cpred is not None:
            other = self._pred_chain(chunk_start, jump_first=True)
            if other != chain:
                t, guarded = resolve(slice_start, last, other)
            if not t and self.cond_first:  # a loop entered by a conditional branch (`bnez a5, loop`): its entry
                third = self._pred_chain(chunk_start, cond_first=True)
                if third != chain and third != other:
                    t, guarded = resolve(slice_start, last, third)
        if not t and self.gotos:  # a computed goto of a function with a dispatch table (gototables.py)
            t, guarded = next((labels for lo, hi, labels in self.gotos if lo <= last < hi), []), False
        return t, guarded

    def _pred_chain(
        self, chunk_start: int, hops: int = 32, jump_first: bool = False, cond_first: bool = False
    ) -> list[tuple[int, int]]:
        """(start, end) of the chunks before the slice, following one recorded predecessor each."""
        out: list[tuple[int, int]] = []
        seen = {chunk_start}
        first = self.pred.get(chunk_start, chunk_start)
        p = self._pred_of(first, jump_first, cond_first)
        while p is not None and p not in seen and len(out) < hops:
            seen.add(p)
            c = self.chunks.get(p)
            if c is None:
                break
            out.append((p, c[0]))
            p = self._pred_of(p, jump_first, cond_first)
        return out

    def _pred_of(self, va: int, jump_first: bool = False, cond_first: bool = False) -> int | None:
        """One recorded predecessor: falling into `va`, else jumping to it, else branching to it
        (`jump_first`: jumping to it first; `cond_first`: branching to it first)."""
        if cond_first and self.cpred is not None and va in self.cpred:
            return self.cpred[va]
        p = self.jpred.get(va, self.pred.get(va)) if jump_first else self.pred.get(va, self.jpred.get(va))
        if p is None and self.cpred is not None:
            p = self.cpred.get(va)
        return p
