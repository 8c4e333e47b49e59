"""How a result shows itself: as the CLI's tables in a notebook and on a Rich console, and as rows.

The result models live in the core, which never imports the renderers; the methods below import
:mod:`zerocalc.render.display` when they are called (a notebook displaying a result, a console printing
it), so defining or computing a result imports nothing of the rendering.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType


class TableDisplay:
    """A mixin for result models: ``_repr_html_`` (Jupyter), ``__rich_console__`` (``rich.print``),
    ``to_rows`` and ``to_frame`` (pandas, when it is installed)."""

    __slots__ = ()

    def _repr_html_(self) -> str:
        """The tables ``zerocalc`` prints for this result, as HTML (Rich's export)."""
        from zerocalc.render.display import result_html

        return result_html(self)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterable[RenderableType]:
        """The tables ``zerocalc`` prints for this result, at the width of the console printing it."""
        from zerocalc.render.display import result_renderables

        return result_renderables(self, options.max_width)

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per strategy: its name under ``strategy``, then the CLI table's columns under their
        headers (on one line), sizes in bytes, fractions and ratios as numbers, times in seconds."""
        from zerocalc.render.display import result_rows

        return result_rows(self)

    def to_frame(self) -> Any:
        """:meth:`to_rows` as a ``pandas.DataFrame`` indexed by strategy (pandas is not a dependency of
        zerocalc: without it, an ImportError says so)."""
        from zerocalc.render.display import result_frame

        return result_frame(self)
