"""``python -m dpsql`` runs the CLI."""

from dpsql.cli import main

main()
