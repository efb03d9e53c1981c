"""Start an analysis process with the standard library alone.

The one-shot CLI starts it before importing anything else of its own (~45 ms of argument parser
and ~40 ms of `jobs.client`'s imports), so the process's start-up and the engine's imports
overlap the CLI's; `jobs.client.prestart` then gives it its request.
"""

from __future__ import annotations

import os
import subprocess
import sys


def spawn_analysis_process() -> subprocess.Popen[bytes]:
    """`python -m binlens.jobs.child` in its own session (a kill of its group takes whatever it
    forked), fed and read through pipes."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "binlens.jobs.child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
        start_new_session=True,
    )
