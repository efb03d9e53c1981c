"""Builds the one C extension of binlens; everything else is in pyproject.toml.

`binlens.analysis._x86scan` decodes plain x86 code for the analysis engine (see its source). It
is optional: where no C compiler is at hand, binlens runs the same analysis on its iced-x86 path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("binlens.analysis._x86scan", ["src/binlens/analysis/_x86scan.c"], optional=True)])
