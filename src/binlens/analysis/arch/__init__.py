"""Per-instruction-set knowledge the passes share: one profile per ISA (`arch/profiles.py`)."""
