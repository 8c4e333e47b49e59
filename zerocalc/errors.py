"""The one exception type the core raises for bad input.

The CLI turns it into one line on stderr and exit code 2 (see ``zerocalc.cli``); library callers get a
``ValueError`` subclass they can catch.
"""

from __future__ import annotations


class InputError(ValueError):
    """A user-supplied value is not accepted. The message names the value and what is accepted."""
