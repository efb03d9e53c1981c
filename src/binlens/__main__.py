"""`python -m binlens` is the `binlens` command."""

from binlens.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
