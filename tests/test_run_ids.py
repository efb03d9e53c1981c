"""Run ids (issue 26 item 2): every analysis run, full or local, is allocated `analysis_run.run_id`
before any of its work starts, and the results that come from a run name it."""

from __future__ import annotations

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.store.analysis import load_run, run_log
from binlens.workspace import Config, Workspace

pytestmark = pytest.mark.timeout(180)


def _open(home, path):
    ws = Workspace(Config(home=home))
    return ws, invoke(ws, "program.open", {"path": str(path)})


def test_open_allocates_the_run_before_the_analysis_starts(tmp_path, compile_c):
    """program.open names a run that is logged as allocated while nothing has run yet; the analysis
    is that run, its stored rows name it, and a reopen in another process's place names it again."""
    path = compile_c("sample.c", "-O2", True)
    ws, opened = _open(tmp_path / "home", path)
    run_id = opened["run_id"]
    assert run_id.startswith("run_") and len(run_id) == 36
    prog = next(iter(ws.programs.values()))
    status = invoke(ws, "analysis.get", {})
    assert (status["status"], status["run_id"]) == ("not_started", run_id)
    assert [(r["run_id"], r["kind"], r["status"]) for r in run_log(prog.db)] == [(run_id, "full", "allocated")]
    with pytest.raises(BinlensError) as info:  # a result that cannot come yet names the run it waits for
        invoke(ws, "function.list", {"wait": False})
    assert info.value.details["run_id"] == run_id
    done = invoke(ws, "analysis.start", {"wait": True})
    assert (done["status"], done["run_id"]) == ("done", run_id)
    assert load_run(prog.db).run_id == run_id
    assert [(r["run_id"], r["status"]) for r in run_log(prog.db)] == [(run_id, "done")]
    ws.close(prog.handle)
    again, reopened = _open(tmp_path / "home", path)
    assert reopened["run_id"] == run_id  # the stored analysis, no new run
    assert invoke(again, "analysis.get", {})["run_id"] == run_id
    assert len(run_log(next(iter(again.programs.values())).db)) == 1


def test_a_local_reanalysis_is_a_run_of_its_own(tmp_path, compile_c):
    """function.create re-analyses locally under a new run id, which the stored analysis and
    analysis.get name from then on."""
    path = compile_c("sample.c", "-O2", True)
    ws, opened = _open(tmp_path / "home", path)
    first = invoke(ws, "analysis.start", {"wait": True})["run_id"]
    main = int(invoke(ws, "function.get", {"selector": {"name": "main"}})["address"], 16)
    invoke(ws, "function.create", {"selector": {"address": hex(main + 4)}})
    prog = next(iter(ws.programs.values()))
    log = run_log(prog.db)
    assert [(r["kind"], r["status"]) for r in log] == [("full", "done"), ("local", "done")]
    second = log[1]["run_id"]
    assert second != first
    assert invoke(ws, "analysis.get", {})["run_id"] == second
    assert invoke(ws, "program.get", {})["run_id"] == second
    assert load_run(prog.db).run_id == second
