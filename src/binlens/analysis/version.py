"""The engine's version, apart from the engine: the stored analysis records it, and a process that
only reads stored analyses (the CLI, a server) checks it without importing the engine."""

# What each version changed in the results: docs/ENGINE.md, "Engine versions".
ENGINE_VERSION = "12"
