"""The catalog's schemas built by several threads at once, as concurrent first `interface.get` calls do."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# A fresh interpreter, so no schema or serializer is built before the threads start.
SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from binlens.api.registry import REGISTRY
    specs = list(REGISTRY.values())
    start = threading.Barrier(8)
    failures = []

    def build(order):
        start.wait()
        for spec in order:
            try:
                spec.input_schema(); spec.output_schema()
            except Exception as err:  # the race raised AssertionError inside pydantic
                failures.append(f"{spec.name}: {type(err).__name__}: {err}"[:200])

    threads = [threading.Thread(target=build, args=(specs[i::1] if i % 2 else specs[::-1],)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(len(specs), len(failures))
    print("\\n".join(failures[:5]), file=sys.stderr)
    """
)


def test_schemas_built_by_concurrent_threads_all_succeed():
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(SRC)}
        )
        assert out.returncode == 0, out.stderr[-2000:]
        methods, failures = map(int, out.stdout.split())
        assert methods > 50
        assert failures == 0, out.stderr
