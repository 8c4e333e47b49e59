"""A path the user typed, ``~`` expanded."""

from __future__ import annotations

import os
from pathlib import Path


def user_path(text: str | os.PathLike[str]) -> Path:
    """``text`` with a leading ``~`` or ``~user`` expanded; left as typed where that names no home
    (``Path.expanduser`` raises ``RuntimeError`` for ``~0``; ``os.path.expanduser`` returns it unchanged,
    so the caller reports a missing file in one line)."""
    return Path(os.path.expanduser(os.fspath(text)))
