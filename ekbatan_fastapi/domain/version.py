"""The library's version, written only here: ``pyproject.toml`` reads it (``dynamic``), and
so do the package metadata and ``ekbatan_fastapi.__version__`` (CHANGELOG.md, "Version policy")."""

from __future__ import annotations

__all__ = ["VERSION"]

VERSION = "0.1.0"
