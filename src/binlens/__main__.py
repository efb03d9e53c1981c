"""`python -m binlens` is the `binlens` command."""

from binlens.cli.main import main

raise SystemExit(main())
