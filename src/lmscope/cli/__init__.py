"""The `lmscope` command line: the typer app (`app`), its entry point (`main`), and the glue that
runs a sweep and shows its table.

`lmscope.cli:main` is the console script of pyproject.toml; `python -m lmscope` runs it too.
"""

from lmscope.cli.app import app, main

__all__ = ["app", "main"]
