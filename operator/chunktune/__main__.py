"""``python -m chunktune`` runs the command line."""

from chunktune.cli import main

raise SystemExit(main())
