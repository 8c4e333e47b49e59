"""``--html FILE`` of ``plan``, ``memory`` and ``comm``: checked before the work (plotly installed, the
path writable), the page written atomically after it (:mod:`zerocalc.render.html_page`); imported only
when ``--html`` is given."""

from __future__ import annotations

import typer

from zerocalc.cli.base import fail


def check_html(path: str) -> None:
    """Refuse ``--html`` before any work: plotly missing (the extra to install), a path not writable."""
    from zerocalc.base.atomic import unwritable
    from zerocalc.base.errors import InputError, shown
    from zerocalc.render.html_page import load_plotly

    why = unwritable(path)
    if why is not None:
        raise InputError(f"--html {shown(path)} {why}; accepted: a file path to write")
    load_plotly()


def write_html(path: str, page: str, json: bool) -> None:
    """Write ``page`` to ``path`` atomically and say so (on stderr under --json, which owns stdout)."""
    from zerocalc.base.errors import why_not
    from zerocalc.render.html_page import write_page

    try:
        write_page(path, page)
    except OSError as exc:  # the path was checked first: the disk or its permissions changed
        raise fail(f"--html {path!r} cannot be written ({why_not(exc)})", 1) from None
    from zerocalc.cli.render import console

    notice = f"figures written to {path} (one HTML file; it loads nothing from the network)"
    if json:  # stdout is the JSON's
        typer.echo(notice, err=True)
    else:  # within the terminal's width: a long path folds
        console().print(notice, markup=False, highlight=False, overflow="fold")
