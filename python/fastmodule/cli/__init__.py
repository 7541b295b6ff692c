"""Helpers shared by the ``python -m fastmodule`` subcommands."""
