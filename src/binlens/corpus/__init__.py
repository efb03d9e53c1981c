"""Many programs at once (`docs/CORPUS.md`): indexing folders of binaries in parallel on Ray into a
corpus store (SQLite under `$BINLENS_HOME`, or PostgreSQL by URL), and searching it by function
similarity, string and import."""
