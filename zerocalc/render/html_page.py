"""One self-contained HTML page of figures and tables (``--html FILE``, and a result's notebook display):
plotly.js and every figure's data inline, nothing loaded from the network.

plotly (the ``html`` extra) is imported only here and only when a page is made, so that no command's
start-up imports it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from zerocalc.base.errors import InputError

if TYPE_CHECKING:
    from types import ModuleType

HTML_EXTRA = "pip install 'zerocalc[html]'"
"""What installs plotly, the library the figures are drawn with (pyproject.toml's ``html`` extra)."""
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
"""plotly.js's options: no link to plotly's site in the toolbar; figures follow the window's width."""
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
STYLE = f"""
body {{ font-family: {FONT}; margin: 16px 24px; color: #222; }}
h1 {{ font-size: 20px; margin: 0 0 4px 0; }}
h2 {{ font-size: 16px; margin: 20px 0 6px 0; }}
p.lead {{ margin: 0 0 8px 0; color: #444; font-size: 14px; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 4px 0 12px 0; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }}
th {{ background: #f3f3f3; }}
td.text, th.text, td.code {{ text-align: left; }}
td.code {{ font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 11px; }}
pre, code {{ font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 12px; }}
pre.detail {{ background: #f7f7f7; border: 1px solid #ddd; padding: 6px 8px; white-space: pre-wrap; }}
ul.notes {{ font-size: 13px; color: #444; }}
"""


def load_plotly() -> ModuleType:
    """``plotly.graph_objects``, or an :class:`InputError` naming the extra that installs it."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise InputError(f"--html draws with plotly, which is not installed: {HTML_EXTRA}") from None
    return go


def plotly_installed() -> bool:
    """Whether plotly can be imported (a notebook shows the figures only then)."""
    import importlib.util

    return importlib.util.find_spec("plotly") is not None


class Table(NamedTuple):
    """A table of the page: its title, column headers and rows of cells (text; ``text`` columns left
    aligned, the others right aligned, as numbers are)."""

    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    text_columns: frozenset[int] = frozenset({0})
    code_columns: frozenset[int] = frozenset()
    """Columns of commands: left aligned, in a monospace font."""


class Section(NamedTuple):
    """A figure with what follows it: an optional script run once it is drawn (``{plot_id}`` is its
    element's id), and a detail box the script may fill."""

    figure: Any
    script: str | None = None
    detail: str | None = None
    """The initial text of a ``<pre class="detail">`` under the figure (id ``{plot_id}-detail``)."""


def _table_html(table: Table) -> str:
    def cell(tag: str, column: int, text: str) -> str:
        kind = ' class="text"' if column in table.text_columns else ""
        kind = ' class="code"' if column in table.code_columns else kind
        return f"<{tag}{kind}>{html.escape(text).replace(chr(10), '<br>')}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(table.headers))
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in table.rows
    )
    return f"<h2>{html.escape(table.title)}</h2>\n<table><tr>{head}</tr>{body}</table>"


def body_html(sections: Sequence[Section], tables: Sequence[Table], notes: Sequence[str], prefix: str) -> str:
    """The figures (plotly.js inlined once, before the first), the tables and the notes, as HTML elements;
    ``prefix`` makes the figures' element ids unique in a page (a notebook shows many)."""
    import plotly.io as pio

    parts = []
    for i, section in enumerate(sections):
        plot_id = f"{prefix}-{i}"
        parts.append(
            pio.to_html(
                section.figure,
                include_plotlyjs=i == 0,
                full_html=False,
                div_id=plot_id,
                config=PLOT_CONFIG,
                post_script=section.script,
                include_mathjax=False,
            )
        )
        if section.detail is not None:
            parts.append(f'<pre class="detail" id="{plot_id}-detail">{html.escape(section.detail)}</pre>')
    parts += [_table_html(t) for t in tables]
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(parts)


def page_html(
    title: str, lead: str, sections: Sequence[Section], tables: Sequence[Table], notes: Sequence[str] = ()
) -> str:
    """A whole HTML document: the title, one lead line, then :func:`body_html`."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f'<h1>{html.escape(title)}</h1>\n<p class="lead">{html.escape(lead)}</p>\n'
        f"{body_html(sections, tables, notes, 'zerocalc-figure')}\n</body>\n</html>\n"
    )


def write_page(path: str, text: str) -> None:
    """Write the page atomically (:func:`zerocalc.base.atomic.write_text_atomic`)."""
    from zerocalc.base.atomic import write_text_atomic

    write_text_atomic(path, text)


GIB = 2**30


def gib(value: int | float) -> float:
    """Bytes in GiB, the unit of the figures' memory axes."""
    return value / GIB


def base_layout(go: ModuleType, height: int) -> Any:
    """The layout every figure starts from: white, a readable font, the legend below the plot."""
    return go.Layout(
        template="plotly_white",
        height=height,
        font={"family": FONT, "size": 13},
        margin={"l": 70, "r": 30, "t": 60, "b": 60},
        legend={"orientation": "h", "yanchor": "top", "y": -0.14, "xanchor": "left", "x": 0},
        hoverlabel={"font": {"family": "DejaVu Sans Mono, monospace", "size": 11}, "align": "left"},
    )


def wrapped(text: str, width: int = 96) -> str:
    """``text`` broken at spaces into lines of at most ``width`` characters, joined with ``<br>`` (a
    plotly hover label does not wrap by itself); HTML-escaped."""
    import textwrap

    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    return "<br>".join(html.escape(line) for line in lines)
