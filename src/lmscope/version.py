"""`lmscope --version`: the package version and the commit it runs from."""

from __future__ import annotations

import sys

from lmscope import __version__


def version_line() -> str:
    """'lmscope 0.1.0 (git abc123def456)', or '(git sha unknown)' outside a checkout."""
    from lmscope.results import _git_sha

    sha = _git_sha()
    python = ".".join(map(str, sys.version_info[:3]))
    return f"lmscope {__version__} (git {sha or 'sha unknown'}, python {python})"
