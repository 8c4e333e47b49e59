"""How a result shows itself: as the CLI's tables (and ``--html``'s figures) in a notebook and on a Rich
console, and as rows.

The result models live in the core, which never imports the renderers: the package's facade
(``zerocalc/__init__.py``, above both) hands this module a loader of :mod:`zerocalc.render.display`
(:func:`use_renderers`), called when a result is first displayed (a notebook showing it, a console printing
it), so defining or computing a result imports nothing of the rendering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType


class Renderers(Protocol):
    """What :mod:`zerocalc.render.display` provides for a result."""

    def result_html(self, result: Any) -> str | None: ...
    def result_renderables(self, result: Any, width: int) -> list[Any]: ...
    def result_rows(self, result: Any) -> list[dict[str, Any]]: ...
    def result_frame(self, result: Any) -> Any: ...


_load_renderers: list[Callable[[], Renderers]] = []
"""The loader the facade registered (one)."""


def use_renderers(load: Callable[[], Renderers]) -> None:
    """Register the loader of the renderers (``zerocalc/__init__.py`` does, at import)."""
    _load_renderers[:] = [load]


def _renderers() -> Renderers:
    return _load_renderers[0]()


class TableDisplay:
    """A mixin for result models: ``_repr_html_`` (Jupyter), ``__rich_console__`` (``rich.print``),
    ``to_rows`` and ``to_frame`` (pandas, when it is installed)."""

    __slots__ = ()

    def _repr_html_(self) -> str | None:
        """The tables ``zerocalc`` prints for this result, as HTML (Rich's export), then the figures of
        ``--html`` when plotly is installed."""
        return _renderers().result_html(self)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterable[RenderableType]:
        """The tables ``zerocalc`` prints for this result, at the width of the console printing it."""
        return _renderers().result_renderables(self, options.max_width)

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per strategy: its name under ``strategy``, then the CLI table's columns under their
        headers (on one line), sizes in bytes, fractions and ratios as numbers, times in seconds."""
        return _renderers().result_rows(self)

    def to_frame(self) -> Any:
        """:meth:`to_rows` as a ``pandas.DataFrame`` indexed by strategy (pandas is not a dependency of
        zerocalc: without it, an ImportError says so)."""
        return _renderers().result_frame(self)


class FigureDisplay:
    """A mixin for a result with figures but no tables of its own in the display (``PlanResult``):
    ``_repr_html_`` (Jupyter) shows its figures when plotly is installed, else None (its text repr)."""

    __slots__ = ()

    def _repr_html_(self) -> str | None:
        """The figures of ``--html`` for this result, as HTML elements (plotly.js inline)."""
        return _renderers().result_html(self)
