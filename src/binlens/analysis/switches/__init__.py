"""Indirect jumps: jump tables, one module per instruction set, on a shared symbolic evaluator; computed gotos."""
