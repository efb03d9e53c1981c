"""What the file itself says about code: unwind tables, ARM exception indexes, thunks; the seeds they give."""
