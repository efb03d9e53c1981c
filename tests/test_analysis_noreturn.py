"""The non-returning fixpoint on hand-built bodies (`analysis/discovery/noreturn.py`): what each rule decides."""

from __future__ import annotations

from binlens.analysis.discovery.explorer import Body
from binlens.analysis.discovery.noreturn import noret_callers, returning_functions
from binlens.analysis.model import T_CALL, T_COND, T_FALL, T_RET

F, G, H = 0x1000, 0x1010, 0x1020


def _self_caller(with_ret_path: bool) -> tuple[dict[int, Body], dict[int, tuple]]:
    """F calls itself and then runs into G, which returns (clang's `call luaD_throw; nop` before the
    next function); with `with_ret_path`, F also has a path to a `ret` of its own."""
    chunks: dict[int, tuple] = {
        F: (F + 5, T_CALL, (F, F + 5), F),  # call F (itself)
        F + 5: (G, T_FALL, (G,), F + 5),  # nop, then G's first byte
        G: (G + 1, T_RET, (), G),
    }
    f = Body(chunks=[F, F + 5], edges=[F, F + 5, "call_return"], calls=[F, F], tails=[(F + 5, G)])
    if with_ret_path:
        chunks[F] = (F + 2, T_COND, (F + 8, F + 2), F)
        chunks[F + 2] = (F + 5, T_CALL, (F, F + 5), F + 2)
        chunks[F + 8] = (F + 9, T_RET, (), F + 8)
        f = Body(
            chunks=[F, F + 2, F + 5, F + 8],
            edges=[F, F + 8, "conditional_taken", F, F + 2, "conditional_fallthrough", F + 2, F + 5, "call_return"],
            calls=[F + 2, F],
            tails=[(F + 5, G)],
            has_ret=True,
        )
    return {F: f, G: Body(chunks=[G], has_ret=True)}, chunks


def test_a_function_whose_only_way_out_is_after_calling_itself_does_not_return():
    bodies, chunks = _self_caller(with_ret_path=False)
    assert returning_functions(bodies, set(), chunks) == {G}
    # without the chunks (the body-wide view) the fall into G after the call counted as a way out
    assert returning_functions(bodies, set()) == {F, G}


def test_a_recursive_function_with_a_return_of_its_own_returns():
    bodies, chunks = _self_caller(with_ret_path=True)
    assert returning_functions(bodies, set(), chunks) == {F, G}


def test_callers_of_a_new_non_returning_function_join_it_up_the_chain():
    """H calls G then returns only through what follows; G calls F (found not to return)."""
    chunks = {
        F: (F + 1, T_RET, (), F),  # (not looked at: F is already found not to return)
        G: (G + 5, T_CALL, (F, G + 5), G),
        G + 5: (G + 6, T_RET, (), G + 5),
        H: (H + 5, T_CALL, (G, H + 5), H),
        H + 5: (H + 6, T_RET, (), H + 5),
    }
    bodies = {
        F: Body(chunks=[F], has_ret=True),
        G: Body(chunks=[G, G + 5], edges=[G, G + 5, "call_return"], calls=[G, F], has_ret=True),
        H: Body(chunks=[H, H + 5], edges=[H, H + 5, "call_return"], calls=[H, G], has_ret=True),
    }
    assert noret_callers(bodies, chunks, set(), {F}, set()) == {G, H}
    # an open end (an unresolved indirect jump) keeps the benefit of the doubt
    bodies[H].open_end = True
    assert noret_callers(bodies, chunks, set(), {F}, set()) == {G}
