"""`python -m mlhpc` runs the command line."""

from mlhpc.cli import main

raise SystemExit(main())
