"""binlens's engine in-process, without the CLI or program database: load, `analyze`, print the starts.

Used by the benchmarks only when the installed binlens has no `functions` command yet (the table
then says `binlens (API)`); run with binlens's own interpreter:

    .venv/bin/python bench/binlens_driver.py BINARY [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    """Load the image in binlens's loader, analyse it fully, write the function starts as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--out")
    args = ap.parse_args()
    from binlens.analysis import analyze  # noqa: I001 - first-party once the engine is merged
    from binlens.loader.isolate import load_image

    t0 = time.monotonic()
    image = load_image(args.binary)
    result = analyze(image)
    answer = {
        "tool": "binlens-api",
        "starts": sorted({f.address for f in result.functions}),
        "blocks": sum(len(f.blocks) for f in result.functions),
        "xrefs": len(result.xrefs),
        "strings": len(result.strings),
        "seconds": round(time.monotonic() - t0, 3),
    }
    text = json.dumps(answer)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
