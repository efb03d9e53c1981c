"""The child side of the angr provider: loads the program once, decompiles one function per request.

angr's own route to a function's code is a CFG of the whole binary first (minutes on libpython;
libc needs a patch). Here binlens has already found the function and its blocks, so the request
carries them: CFGFast runs over the function's regions only, seeded with its entry, and the
Decompiler runs on that. Each request gets a fresh knowledge base (a CFG of another function must
not leave functions behind that change this one's output), while the loaded program (`cle`) stays
warm for the session's life.

The program is loaded from its bytes in memory (`cle` reads a stream), never from a path: the file
on disk may have changed since binlens opened it, and may lie outside the server's roots.
"""

from __future__ import annotations

import bisect
import io
import logging
import re
from typing import Any

from binlens.providers.base import Progress, ProviderFailure

logging.disable(logging.CRITICAL)  # angr logs per function (and on import) to stderr: the server's log

APPROXIMATE = "decompiled code is approximate: angr's output can be wrong (loop bounds, signedness, types)"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")
MAX_RENAMES_SHOWN = 8


class AngrHandler:
    """Answers `open` (the program's bytes and where to map them) and `decompile` requests."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.base = 0
        self.project: Any = None

    def handle(self, op: str, args: dict[str, Any], blob: bytes, progress: Progress) -> tuple[dict[str, Any], bytes]:
        """`open` keeps the bytes (angr loads on the first `decompile`, within that call's timeout)."""
        if op == "open":
            self.data = bytes(blob)
            self.base = int(args.get("base", 0))
            return {}, b""
        if op == "decompile":
            return self.decompile(args, progress), b""
        raise ProviderFailure("internal", f"unknown request {op!r}")

    # --- the program ----------------------------------------------------------------------------
    def _load(self, progress: Progress) -> Any:
        if self.project is not None:
            return self.project
        if self.data is None:
            raise ProviderFailure("internal", "no program is open in this session")
        progress(0, 4, "loading angr")
        import angr

        _region_only_data_pass()
        _array_pointers_as_element_pointers()
        progress(1, 4, "loading the program in angr")
        try:
            self.project = angr.Project(
                io.BytesIO(self.data),
                auto_load_libs=False,
                load_debug_info=False,
                main_opts={"base_addr": self.base},
            )
        except Exception as err:  # noqa: BLE001 - cle refuses formats and architectures it does not know
            raise ProviderFailure(
                "unsupported", f"angr cannot load this program: {type(err).__name__}: {str(err)[:300]}"
            ) from None
        return self.project

    # --- one function ---------------------------------------------------------------------------
    def decompile(self, args: dict[str, Any], progress: Progress) -> dict[str, Any]:
        """Decompile the function at `args["address"]` over `args["regions"]` ([[start, end], ...]
        from binlens's blocks), with `names` ({hex address: name}) for it and its callees,
        `prototypes` ({hex address: C prototype}), `globals` ({hex address: {name, type}} of the
        data it refers to) and `variables` ({storage: {name, type}})."""
        proj = self._load(progress)
        addr = int(args["address"])
        regions = [(int(s), int(e)) for s, e in args.get("regions", [])] or [(addr, addr + 1)]
        warnings = [APPROXIMATE]
        callees = [(int(c), [(int(s), int(e)) for s, e in r]) for c, r in args.get("callees") or []]
        progress(2, 4, "recovering the function's control flow")
        cfg = _function_cfg(proj, [addr, *(c for c, _r in callees)], regions + [x for _c, r in callees for x in r])
        functions = proj.kb.functions
        if addr not in functions:
            raise ProviderFailure("not_found", f"angr found no function at {hex(addr)}")
        _callee_conventions(proj, [c for c, _r in callees if c in functions], warnings)
        _name_functions(proj, args, warnings)
        spelled: dict[str, str] = {}
        _spell_function_names(proj, spelled)
        progress(3, 4, "decompiling")
        dec = proj.analyses.Decompiler(functions[addr], cfg=cfg.model)
        codegen = dec.codegen
        if codegen is None or codegen.cfunc is None:
            what = "; ".join(str(e.format()).strip().splitlines()[-1] for e in dec.errors[:1]) if dec.errors else ""
            raise ProviderFailure("internal", f"angr's decompiler produced no code{': ' + what if what else ''}")
        wanted = {int(a, 16): g for a, g in (args.get("globals") or {}).items() if isinstance(g, dict)}
        renamed = _annotate_globals(proj, codegen, wanted, warnings)
        renamed = _spell_global_names(codegen, spelled) or renamed
        if spelled:
            shown = ", ".join(f"{a} -> {b}" for a, b in list(spelled.items())[:MAX_RENAMES_SHOWN])
            more = f" and {len(spelled) - MAX_RENAMES_SHOWN} more" if len(spelled) > MAX_RENAMES_SHOWN else ""
            warnings.append(f"names that are not C identifiers are spelled with '_' in the code: {shown}{more}")
        variables = _variables(proj, codegen, args.get("variables") or {}, warnings, renamed)
        return {
            "code": codegen.text,
            "lines": _lines(codegen),
            "variables": variables,
            "warnings": warnings,
        }


def _function_cfg(proj: Any, starts: list[int], regions: list[tuple[int, int]]) -> Any:
    """CFGFast over the function's regions (and its callees') only, seeded with their entries, in a
    fresh knowledge base (inner analyses read `project.kb`; another function's CFG must not change
    this one's output)."""
    import angr

    knowledge_base: Any = angr.KnowledgeBase  # (angr is not annotated)
    proj.kb = knowledge_base(proj, name="global")
    return proj.analyses.CFGFast(
        function_starts=starts,
        regions=regions,
        normalize=True,
        force_complete_scan=False,
        symbols=False,
        function_prologues=False,
        resolve_indirect_jumps=True,
        data_references=True,  # the strings and globals this function uses (its regions only)
        start_at_entry=False,
    )


def _callee_conventions(proj: Any, callees: list[int], warnings: list[str]) -> None:
    """Infer the callees' parameters from their code (angr's CompleteCallingConventions on them
    only), so each call shows its arguments."""
    if not callees:
        return
    try:
        proj.analyses.CompleteCallingConventions(
            recover_variables=True, prioritize_func_addrs=callees, skip_other_funcs=True
        )
    except Exception as err:  # noqa: BLE001 - calls then show without arguments
        warnings.append(f"angr could not infer the callees' parameters: {type(err).__name__}")


def _name_functions(proj: Any, args: dict[str, Any], warnings: list[str]) -> None:
    """The user's names and prototypes on the function and its callees."""
    from angr.knowledge_plugins.functions.function import PrototypeSource

    functions = proj.kb.functions
    for text_addr, name in (args.get("names") or {}).items():
        func = functions.function(addr=int(text_addr, 16), create=True)
        if func is not None:
            func.name = name
    for text_addr, proto in (args.get("prototypes") or {}).items():
        func = functions.function(addr=int(text_addr, 16))
        if func is None:
            continue
        try:
            func.prototype = _signature(proj, proto)
            func.calling_convention = _default_cc(proj)
            func.prototype_source = PrototypeSource.USER  # (else the decompiler's own analysis replaces it)
        except Exception as err:  # noqa: BLE001 - a prototype angr's parser refuses is reported, not fatal
            warnings.append(f"angr did not take the prototype at {text_addr}: {type(err).__name__}")


def c_identifier(name: str) -> str:
    """`name` as a C identifier: its other characters as '_' (a compiler's clone suffix
    `f.isra.0`, a symbol version `GLIBC_2.3`); a mangled C++ name stays (angr demangles it)."""
    if _IDENT.fullmatch(name) or name.startswith("_Z"):
        return name
    out = _NOT_IDENT.sub("_", name)
    return out if out and not out[0].isdigit() else "_" + out


def _spell_function_names(proj: Any, spelled: dict[str, str]) -> None:
    """Give the functions angr will print names that are C identifiers (recording each change)."""
    for func in list(proj.kb.functions.values()):
        name = str(func.name)
        new = c_identifier(name)
        if new != name:
            func.name = new
            spelled[name] = new


def _spell_global_names(codegen: Any, spelled: dict[str, str]) -> bool:
    """Give the global variables in the code names that are C identifiers; True when any changed."""
    from angr.sim_variable import SimMemoryVariable, SimStackVariable

    changed = False
    for var in list(codegen.cfunc.variables_in_use):
        if not isinstance(var, SimMemoryVariable) or isinstance(var, SimStackVariable) or not var.name:
            continue
        name = str(var.name)
        new = c_identifier(name)
        if new != name:
            var.name = new
            var.renamed = True
            spelled[name] = new
            changed = True
    return changed


def _array_pointers_as_element_pointers() -> None:
    """Print a pointer to an array of T as a pointer to T.

    angr prints a pointer to `T[N]` as the array itself (`unsigned int v2[4]` for a register,
    `unsigned int [4] f(...)` for a return type, `(unsigned int [4])0x20b260` for a cast), which
    is not C: an array cannot be assigned, returned or cast to. A pointer to its first element
    holds the same address and indexes the same way, and C accepts it everywhere."""
    from angr.sim_type import SimTypeArray, SimTypePointer

    if getattr(SimTypePointer.c_repr, "_binlens_element_pointer", False):
        return
    plain = SimTypePointer.c_repr

    def element_pointer(
        self: Any, name: Any = None, full: int = 0, memo: Any = None, indent: int = 0, **kw: Any
    ) -> Any:
        if isinstance(self.pts_to, SimTypeArray) and (self.label is None or name is None):
            quals = " ".join(self.qualifier) if self.qualifier else ""
            inner = f"*{quals} {name}" if quals and name else f"*{quals}" if quals else f"*{name}" if name else "*"
            return self.pts_to.elem_type.c_repr(inner, full, memo, indent)
        return plain(self, name, full, memo, indent, **kw)

    element_pointer._binlens_element_pointer = True  # type: ignore[attr-defined]
    setattr(SimTypePointer, "c_repr", element_pointer)  # noqa: B010 - (angr's class, patched in this child only)


def _region_only_data_pass() -> None:
    """Make CFGFast's closing data pass classify only the data the scanned code referenced.

    Its post-analysis seeds an entry at every data section and then, with `fill_gaps`, walks every
    gap of every data section guessing types (140,000 entries and over a minute on libpython, per
    function). A CFG of one function's regions needs only the entries its code refers to."""
    from angr.knowledge_plugins.cfg.cfg_model import CFGModel

    if getattr(CFGModel.tidy_data_references, "_binlens_region_only", False):
        return
    full = CFGModel.tidy_data_references

    def region_only(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["fill_gaps"] = False
        if not args and kwargs.get("memory_data_addrs") is None:
            # only the entries the code refers to, not the one seeded at every data section
            referenced = {md.addr for md in self.insn_addr_to_memory_data.values()}
            kwargs["memory_data_addrs"] = sorted(a for a in referenced if a in self.memory_data)
        return full(self, *args, **kwargs)

    region_only._binlens_region_only = True  # type: ignore[attr-defined]
    setattr(CFGModel, "tidy_data_references", region_only)  # noqa: B010 - (angr's class, patched in this child only)


def _signature(proj: Any, text: str) -> Any:
    from angr.sim_type import parse_signature

    text = text.strip()
    return parse_signature(text if text.endswith(";") else text + ";").with_arch(proj.arch)


def _default_cc(proj: Any) -> Any:
    from angr.calling_conventions import default_cc

    cc = default_cc(proj.arch.name, platform=proj.simos.name if proj.simos is not None else None)
    return cc(proj.arch) if cc is not None else None


def _annotate_globals(proj: Any, codegen: Any, wanted: dict[int, dict[str, Any]], warnings: list[str]) -> bool:
    """Give the global variables the code uses the user's names and types (by address); True when
    any changed."""
    from angr import sim_type
    from angr.sim_variable import SimMemoryVariable, SimStackVariable

    parse: Any = sim_type.parse_type  # (angr is not annotated)
    changed = False
    for var in list(codegen.cfunc.variables_in_use):
        if not isinstance(var, SimMemoryVariable) or isinstance(var, SimStackVariable) or var.addr not in wanted:
            continue
        edit = wanted[var.addr]
        if edit.get("name"):
            var.name = str(edit["name"])
            var.renamed = True
            changed = True
        if edit.get("type"):
            try:
                ty = parse(str(edit["type"]), arch=proj.arch)
                codegen._variable_kb.variables["global"].set_variable_type(var, ty, mark_manual=True)
                changed = True
            except Exception as err:  # noqa: BLE001 - reported, the rest still applies
                warnings.append(f"angr did not take the type {edit['type']!r} at {hex(var.addr)}: {type(err).__name__}")
    if changed:
        codegen.reload_variable_types()
    return changed


def _variables(
    proj: Any, codegen: Any, edits: dict[str, Any], warnings: list[str], changed: bool = False
) -> list[dict[str, Any]]:
    """The function's parameters and locals as `{name, type, storage}`, after applying the user's
    `edits` (by storage) and regenerating the text when any applied (or `changed` says the caller
    renamed something)."""
    cfunc = codegen.cfunc
    arch = proj.arch
    found: list[tuple[str, Any, Any]] = []  # (storage, SimVariable, type)
    for i, arg in enumerate(cfunc.arg_list or []):
        var = getattr(arg, "unified_variable", None) or getattr(arg, "variable", None)
        if var is not None:
            found.append((f"arg:{i}", var, getattr(arg, "variable_type", None)))
    seen: dict[str, int] = {}
    for var in cfunc.sort_local_vars(cfunc.unified_local_vars):
        loc = str(var.loc_repr(arch))
        n = seen.get(loc, 0)
        seen[loc] = n + 1
        types = [t for _cvar, t in cfunc.unified_local_vars[var]]
        found.append((f"{loc}#{n}" if n else loc, var, types[0] if types else None))
    for storage, var, _ty in found:
        edit = edits.get(storage)
        if not edit:
            continue
        if edit.get("name"):
            var.name = str(edit["name"])
            var.renamed = True
            changed = True
        if edit.get("type"):
            try:
                from angr import sim_type

                parse: Any = sim_type.parse_type  # (angr is not annotated)
                ty = parse(str(edit["type"]), arch=arch)
                cfunc.variable_manager.set_variable_type(var, ty, all_unified=True, mark_manual=True)
                changed = True
            except Exception as err:  # noqa: BLE001 - reported, the rest of the edits still apply
                warnings.append(f"angr did not take the type {edit['type']!r} of {storage}: {type(err).__name__}")
    if changed:
        cfunc.refresh()
        codegen.regenerate_text()
        found = [(s, v, _declared_type(cfunc, v) if not s.startswith("arg:") else t) for s, v, t in found]
    return [{"name": str(v.name), "type": _c(t), "storage": s} for s, v, t in found]


def _declared_type(cfunc: Any, var: Any) -> Any:
    types = [t for _cvar, t in cfunc.unified_local_vars.get(var, ())]
    return types[0] if types else None


def _c(ty: Any) -> str | None:
    if ty is None:
        return None
    try:
        return str(ty.c_repr())
    except Exception:  # noqa: BLE001 - a type angr cannot spell
        return str(ty)


def _lines(codegen: Any) -> list[list[Any]]:
    """[line (1-based), [instruction addresses]] for every line of the text that came from code."""
    text = codegen.text
    starts = [0]
    starts += [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    by_line: dict[int, set[int]] = {}
    for pos, elem in codegen.map_pos_to_addr.items():
        tags = getattr(elem.obj, "tags", None) or {}
        ins = tags.get("ins_addr")
        if isinstance(ins, int):
            by_line.setdefault(bisect.bisect_right(starts, pos), set()).add(ins)
    return [[line, sorted(addrs)] for line, addrs in sorted(by_line.items())]
