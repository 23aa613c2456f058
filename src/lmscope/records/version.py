"""`lmscope --version`: the package version and the source it runs from."""

from __future__ import annotations

import sys

from lmscope import __version__


def version_line() -> str:
    """'lmscope 0.1.0 (git abc123def456, source 0123abcd4567, python 3.12.1)': the commit where the
    package is an lmscope checkout, else how it was found (installed or a copy), and the source hash."""
    from lmscope.records.provenance import source_identity

    found = source_identity()
    origin = f"git {found['git_sha']}" if found["git_sha"] else f"{found['source']}, git sha unknown"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"lmscope {__version__} ({origin}, source {found['source_hash']}, python {python})"
