"""Table building shared by the CLI and the results' notebook display: byte cells, tables of numbers
fitted to a width, compact tables.

Everything here prints on an :class:`Output` (a Rich console, or a collector of renderables): the CLI
passes its console, :mod:`zerocalc.render.display` a recording console or the console it is printed on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from zerocalc.base.units import ByteUnit, format_bytes

if TYPE_CHECKING:
    from rich.table import Table


class Output(Protocol):
    """Where a renderer prints: Rich markup strings and renderables, at a width."""

    @property
    def width(self) -> int: ...

    def print(self, *objects: Any) -> None: ...


class _TrimmedLines:
    """A renderable as it renders, less the spaces at the end of each line (Rich keeps a wrapped line's
    last space, and pads cells it does not need to): nothing of what is shown changes, no line is cropped
    or re-wrapped."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        line: list[Any] = []
        for segment in console.render(self.renderable, options):
            if segment.control or "\n" not in segment.text:
                line.append(segment)
                continue
            *ends, rest = segment.text.split("\n")
            for end in ends:
                line.append(Segment(end, segment.style))
                yield from _rstripped(line)
                yield Segment.line()
                line = []
            if rest:
                line.append(Segment(rest, segment.style))
        yield from line


def _rstripped(line: list[Any]) -> list[Any]:
    """``line``'s segments without the whitespace that ends it (control segments kept in place)."""
    from rich.segment import Segment

    kept = list(line)
    for i in range(len(kept) - 1, -1, -1):
        segment = kept[i]
        if segment.control:
            continue
        text = segment.text.rstrip()
        if text:
            kept[i] = Segment(text, segment.style)
            return kept
        del kept[i]
    return kept


class TrimLineEnds:
    """A Rich render hook: everything printed on the console it is pushed on loses its lines' trailing
    spaces (``console.push_render_hook(TrimLineEnds())``); the CLI's console and the notebook display's."""

    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_TrimmedLines(renderable) for renderable in renderables]


def print_phrases(out: Output, *phrases: str) -> None:
    """Print a heading made of phrases (``Ψ = 7,000,000,000 (7B),``, ``b_p = 2,``) joined by spaces,
    breaking lines only between them, so that a formula is never cut (``b_p =`` / ``2``) at the
    output's width; a phrase wider than the output wraps on its own."""
    lines: list[str] = []
    for phrase in phrases:
        if lines and _cell_width(lines[-1] + " " + phrase) <= out.width:
            lines[-1] += " " + phrase
        else:
            lines.append(phrase)
    for line in lines:
        out.print(line)


def unit_label(unit: ByteUnit) -> str:
    if unit is ByteUnit.B:
        return "bytes"
    power = {"Ki": "2^10", "Mi": "2^20", "Gi": "2^30", "Ti": "2^40"}.get(unit.value[:2])
    decimal = {"K": "10^3", "M": "10^6", "G": "10^9", "T": "10^12"}.get(unit.value[0])
    return f"{unit.value} (1 {unit.value} = {power if power else decimal} bytes)"


def byte_cell(n_bytes: int, unit: ByteUnit) -> str:
    return format_bytes(n_bytes, unit)


def byte_text(n_bytes: int, unit: ByteUnit) -> str:
    """A size in running text: with its unit (tables say theirs in the header)."""
    return f"{format_bytes(n_bytes, unit)} {'bytes' if unit is ByteUnit.B else unit.value}"


class Column(NamedTuple):
    """One column of numbers for :func:`print_fitted`: its header (``\\n`` where it may break) and cells."""

    header: str
    cells: list[str]
    justify: Literal["left", "center", "right"] = "right"


def _cell_width(text: str) -> int:
    from rich.text import Text

    return max((Text.from_markup(line).cell_len for line in text.split("\n")), default=0)


def _pack(columns: list[Column], widths: list[int], budget: int) -> list[list[Column]]:
    groups: list[list[Column]] = [[]]
    used = 0
    for column, width in zip(columns, widths, strict=True):
        if groups[-1] and used + width + 3 > budget:
            groups.append([])
            used = 0
        groups[-1].append(column)
        used += width + 3
    return groups


def print_fitted(
    out: Output,
    key_header: str,
    keys: list[str],
    columns: list[Column],
    *,
    key_width: int = 14,
    title: str | None = None,
) -> None:
    """Print a table of a text key column and columns of numbers at ``out``'s width: the numbers are
    never cut or wrapped; columns that do not fit go to a further table with the same keys, and the key
    column wraps (at least ``key_width`` wide)."""
    from rich.table import Table

    widths = [max(_cell_width(c.header), *(_cell_width(x) for x in c.cells)) for c in columns]
    natural = max(_cell_width(key_header), *(_cell_width(k) for k in keys))
    for fitted in (natural, min(natural, key_width)):  # the keys whole if all columns then fit
        # the key column is at least key_width wide; + its padding and separator, the outer borders
        groups = _pack(columns, widths, out.width - max(fitted, key_width) - 4)
        if len(groups) == 1:
            break
    for number, group in enumerate(groups):
        table = Table(title=title if number == 0 else None, header_style="bold")
        table.add_column(key_header, overflow="fold", min_width=key_width)
        for column in group:
            table.add_column(column.header, justify=column.justify, no_wrap=True)
        for i, key in enumerate(keys):
            table.add_row(key, *(column.cells[i] for column in group))
        out.print(table)


STEP_TIME_ACCURACY = (
    "step times are estimates from the compute table's rates and the links' bandwidths: 3-9% under the "
    "steps measured on the 700 W H100 and H200 the tables come from; -10% to 0% on Megatron-LM's "
    "published A100 runs, -18% on its DGX H100 CI run; torchtitan's 500 W H100s run 45% slower than "
    "predicted (docs/model.md, Step time)"
)
"""What the step time's checks measured (docs/model.md, Step time, and docs/validation.md), said under
every table of step times (``comm``'s, ``plan``'s)."""


OP_SHORT = {
    "all_gather": "AG",
    "reduce_scatter": "RS",
    "all_reduce": "AR",
    "broadcast": "BC",
    "all_to_all": "A2A",
    "send_recv": "P2P",
}
PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "after_step": "step"}
COLLECTIVE_LEGEND = (
    "AG all_gather, RS reduce_scatter, AR all_reduce, BC broadcast, A2A all_to_all; fwd forward, "
    "bwd backward, step after optimizer.step"
)


def collective_label(op: str, phase: str) -> str:
    """``AG fwd``: a collective and its phase, short (:data:`COLLECTIVE_LEGEND` spells them out)."""
    return f"{OP_SHORT.get(op, op)} {PHASE_SHORT.get(phase, phase)}"


def compact_table(*columns: tuple[str, bool, str]) -> Table:
    """A table without vertical rules, so that it fits 80 columns: (header, numeric, footer) per column;
    numbers are right-aligned and never wrapped, text wraps."""
    from rich import box
    from rich.table import Table

    table = Table(
        box=box.SIMPLE,
        header_style="bold",
        footer_style="bold",
        padding=(0, 1),
        pad_edge=False,
        show_edge=False,
        show_footer=any(footer for _, _, footer in columns),
    )
    for header, numeric, footer in columns:
        table.add_column(
            header,
            footer,
            justify="right" if numeric else "left",
            no_wrap=numeric,
            overflow="ellipsis" if numeric else "fold",
            min_width=None if numeric else max([1, *(len(word) for word in header.split())]),
        )
    return table
