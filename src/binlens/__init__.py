"""binlens: a headless binary-analysis server for AI agents and people."""

__version__ = "0.1.0"
