"""Builds binlens's three C extensions; everything else is in pyproject.toml.

`binlens.analysis.native._x86scan` decodes plain x86 code for the analysis engine, `binlens.analysis.native._descent`
runs the explorer's walk and holds its chunk cache and reached sets (`_chunkmap.h`, `_addrbits.h`; see
their sources); `binlens.store._rows` packs the analysis rows the store writes. All are
optional: where no C compiler is at hand, binlens runs the same analysis in Python (iced-x86
decoding, the Python walk, the Python packers), only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("binlens.analysis.native._x86scan", ["src/binlens/analysis/native/_x86scan.c"], optional=True),
        Extension(
            "binlens.analysis.native._descent",
            ["src/binlens/analysis/native/_descent.c"],
            depends=[
                "src/binlens/analysis/native/_chunkmap.h",
                "src/binlens/analysis/native/_addrbits.h",
                "src/binlens/analysis/native/_predmap.h",
                "src/binlens/analysis/native/_packedrefs.h",
            ],
            optional=True,
        ),
        Extension(
            "binlens.store._rows",
            ["src/binlens/store/_rows.c"],
            depends=["src/binlens/analysis/native/_packedrefs.h"],
            optional=True,
        ),
    ]
)
