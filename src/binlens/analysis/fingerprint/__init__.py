"""Function fingerprints from a finished analysis, their similarity, and the matching of two programs'
functions (`docs/COMPARE.md`). Imports nothing, as the engine's other subpackages."""
