"""The results' display (:class:`zerocalc.base.display.TableDisplay`): the tables the CLI prints, on a
recording console exported as HTML (Jupyter's ``_repr_html_``, with ``--html``'s figures when plotly is
installed) or as renderables for a Rich console, and the tables' values as rows."""

from __future__ import annotations

import io
from typing import Any

from zerocalc.base.units import ByteUnit
from zerocalc.render.tables import Output

NOTEBOOK_WIDTH = 80
"""Columns of the HTML display: the width the CLI's tables are laid out for."""
UNIT = ByteUnit.GiB
"""The unit of the displayed tables (the CLI's default ``--units``)."""
HTML_FORMAT = (
    '<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">{code}</pre>"
)
"""A ``<pre>`` block as Rich's own Jupyter display writes it (``rich/jupyter.py``)."""


class _Collector:
    """An :class:`~zerocalc.render.tables.Output` that keeps what is printed (markup strings become
    ``rich.text.Text``) for a console to render."""

    def __init__(self, width: int):
        self.width = width
        self.printed: list[Any] = []

    def print(self, *objects: Any) -> None:
        from rich.text import Text

        self.printed += [Text.from_markup(o) if isinstance(o, str) else o for o in objects]


def _render(result: Any, out: Output) -> None:
    from zerocalc.comm.estimate import CommEstimate
    from zerocalc.states.memory import MemoryEstimate

    if isinstance(result, MemoryEstimate):
        from zerocalc.render.memory import render_result

        render_result(out, result, UNIT)
    elif isinstance(result, CommEstimate):
        from zerocalc.render.comm import render_comm

        render_comm(out, result, UNIT)
    else:
        raise TypeError(f"no tables for a {type(result).__name__}")


def result_renderables(result: Any, width: int) -> list[Any]:
    """What the CLI prints for ``result`` at ``width`` columns, as Rich renderables."""
    out = _Collector(width)
    _render(result, out)
    return out.printed


def result_html(result: Any) -> str | None:
    """What the CLI prints for ``result`` at :data:`NOTEBOOK_WIDTH` columns, as an HTML ``<pre>``, then
    the figures ``--html`` draws (:func:`figures_html`); a plan's figures alone (None without plotly)."""
    from zerocalc.plan.search import PlanResult

    if isinstance(result, PlanResult):
        return figures_html(result)
    return tables_html(result) + (figures_html(result) or "")


def figures_html(result: Any) -> str | None:
    """The figures of ``--html`` for ``result`` as HTML elements, plotly.js inline (a notebook may be
    offline), with ids of their own; None when plotly is not installed or the result has none (model
    states only: no step to draw)."""
    from zerocalc.render.html_page import body_html, plotly_installed

    if not plotly_installed():
        return None
    from zerocalc.comm.estimate import CommEstimate
    from zerocalc.peak.report import MemoryReport
    from zerocalc.plan.search import PlanResult

    if isinstance(result, PlanResult):
        from zerocalc.render.html_plan import plan_sections

        sections, tables = plan_sections(result)
    elif isinstance(result, MemoryReport) and result.peak is not None:
        from zerocalc.render.html_memory import memory_sections

        sections, tables = memory_sections(result)[0], []  # the tables are the CLI's, above
    elif isinstance(result, CommEstimate):
        from zerocalc.render.html_comm import comm_sections

        sections, tables = comm_sections(result)[0], []
    else:
        return None
    import uuid

    return body_html(sections, tables, (), f"zerocalc-{uuid.uuid4().hex[:12]}")


def tables_html(result: Any) -> str:
    """What the CLI prints for ``result`` at :data:`NOTEBOOK_WIDTH` columns, as an HTML ``<pre>``."""
    from rich.console import Console

    out = Console(  # never Jupyter's own display: in a notebook that would show the tables a second time
        record=True,
        width=NOTEBOOK_WIDTH,
        file=io.StringIO(),
        highlight=False,
        color_system="truecolor",
        force_jupyter=False,
    )
    from zerocalc.render.tables import TrimLineEnds

    out.push_render_hook(TrimLineEnds())
    _render(result, out)
    return out.export_html(inline_styles=True, code_format=HTML_FORMAT)


def result_rows(result: Any) -> list[dict[str, Any]]:
    from zerocalc.comm.estimate import CommEstimate
    from zerocalc.states.memory import MemoryEstimate

    if isinstance(result, MemoryEstimate):
        from zerocalc.render.memory import memory_rows

        return memory_rows(result)
    if isinstance(result, CommEstimate):
        from zerocalc.render.comm import comm_rows

        return comm_rows(result)
    raise TypeError(f"no rows for a {type(result).__name__}")


def result_frame(result: Any) -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(
            "to_frame() needs pandas, which zerocalc does not install (pip install pandas); "
            "to_rows() gives the same rows as a list of dicts"
        ) from None
    return pandas.DataFrame(result_rows(result)).set_index("strategy")
