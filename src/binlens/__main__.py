"""`python -m binlens` is the `binlens` command."""

from binlens.cli.main import console

if __name__ == "__main__":
    console()
