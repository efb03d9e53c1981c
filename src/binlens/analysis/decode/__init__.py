"""Decoding: one backend per instruction set (iced-x86 and the C scanner for x86, capstone for the rest).

A backend decodes a chunk into the explorer's instruction records and scans it for references.
"""
