"""Cross-references and strings: what the code and data point at."""
