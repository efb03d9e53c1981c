"""The analysis as a background job: one program's full analysis run in a disposable process.

- `state`: the per-program analysis state (`ProgramAnalysisState`, attached when a program opens):
  starts the job on first need, relays its progress, honours cancellation, serves the stored view.
- `client`: the caller's end of the pipe (`AnalysisProcess`), and the spare process started early.
- `spawn`: starts the job's process with the standard library alone (the CLI, before its imports).
- `request`: what the caller sends (`AnalysisRequest`).
- `child`: the job's process (`python -m binlens.jobs.child`): load, analyse, save, report.
- `rows`: the analysis as the rows to store, in one process or two.
- `fork`: the forked function builder beside the references.

The frames on the pipe are `binlens.frames`. This file imports nothing: the CLI's start-up is
measured, and `spawn` must load without the rest.
"""
