"""bytes -> Image: format parsing (LIEF, isolated), identity, mapping, symbols."""

from binlens.loader.image import Export, Identity, Image, Import, Relocation, Section, Segment, Symbol
from binlens.loader.isolate import load_image

__all__ = ["Export", "Identity", "Image", "Import", "Relocation", "Section", "Segment", "Symbol", "load_image"]
