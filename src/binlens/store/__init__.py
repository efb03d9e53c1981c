"""The program database (SQLite): analysis cache, annotations, journal."""

from binlens.store.database import ProgramDatabase, database_path, default_home

__all__ = ["ProgramDatabase", "database_path", "default_home"]
