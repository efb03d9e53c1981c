"""Run one peer tool on one binary and print the function starts it found as JSON.

Runs inside the peers venv (see bench/requirements.txt), never in binlens's own environment:

    bench/work/peers-venv/bin/python bench/peer_driver.py angr|smda|ddisasm BINARY [--out FILE]

Each tool runs with its defaults, as a reverse engineer would call it. The output is
`{"tool": ..., "starts": [addresses at link-time virtual addresses], "seconds": analysis time}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time


def run_angr(path: str) -> list[int]:
    """angr CFGFast with its defaults; functions of the main object that are not PLT stubs or SimProcedures."""
    import angr

    proj = angr.Project(path, auto_load_libs=False, load_debug_info=False)
    cfg = proj.analyses.CFGFast()
    main = proj.loader.main_object
    shift = main.mapped_base - main.linked_base  # cle rebases PIE images (to 0x400000)
    starts = []
    for func in cfg.kb.functions.values():
        if func.is_simprocedure or func.is_plt or func.is_syscall or getattr(func, "is_alignment", False):
            continue
        if not main.contains_addr(func.addr):
            continue
        starts.append(func.addr - shift)
    return starts


def run_smda(path: str) -> list[int]:
    """smda's recursive disassembler with its default configuration."""
    from smda.Disassembler import Disassembler

    report = Disassembler().disassembleFile(path)
    if getattr(report, "status", "ok") == "error":
        raise RuntimeError(f"smda failed: {getattr(report, 'message', report)}")
    base = getattr(report, "base_addr", 0) or 0
    # smda reports virtual addresses of the image as it mapped it; its ELF base is the link-time one.
    return [int(f.offset) for f in report.getFunctions()] if base is not None else []


def run_ddisasm(path: str) -> list[int]:
    """ddisasm (PyPI wheel) to GTIRB, then the module's `functionEntries` aux data."""
    import gtirb
    from ddisasm import ddisasm_path

    with tempfile.TemporaryDirectory() as tmp, ddisasm_path() as exe:
        ir_path = os.path.join(tmp, "out.gtirb")
        proc = subprocess.run([str(exe), path, "--ir", ir_path], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ddisasm exited {proc.returncode}: {proc.stderr[-2000:]}")
        ir = gtirb.IR.load_protobuf(ir_path)
    starts: list[int] = []
    for module in ir.modules:
        entries = module.aux_data["functionEntries"].data
        for blocks in entries.values():
            for block in blocks:
                if block.address is not None:
                    starts.append(int(block.address))
    return starts


RUNNERS = {"angr": run_angr, "smda": run_smda, "ddisasm": run_ddisasm}


def main() -> int:
    """Parse arguments, run the tool, write the JSON answer."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tool", choices=sorted(RUNNERS))
    ap.add_argument("binary")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    t0 = time.monotonic()
    starts = sorted(set(RUNNERS[args.tool](args.binary)))
    answer = {"tool": args.tool, "starts": starts, "seconds": round(time.monotonic() - t0, 3)}
    text = json.dumps(answer)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
