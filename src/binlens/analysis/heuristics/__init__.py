"""Starts found in the gaps the walk left: prologues, pointer and call evidence, per-ISA stages."""
