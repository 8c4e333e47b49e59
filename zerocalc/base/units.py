"""Parsing and formatting of counts, byte sizes and bandwidths.

Every size in the core is an exact integer number of bytes; units only appear at the edges: when a user
types ``80GiB`` or ``7B`` and when a table is rendered. Decimal prefixes are powers of 1000 (SI), binary
prefixes powers of 1024 (IEC 80000-13).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from enum import StrEnum

from zerocalc.base.errors import InputError, shown


class ByteUnit(StrEnum):
    """Units a byte count can be rendered in. The value is the spelling users type."""

    B = "B"
    KB = "KB"
    KiB = "KiB"
    MB = "MB"
    MiB = "MiB"
    GB = "GB"
    GiB = "GiB"
    TB = "TB"
    TiB = "TiB"

    @property
    def factor(self) -> int:
        return _BYTE_FACTORS[self.value]


_BYTE_FACTORS: dict[str, int] = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

SI_SUFFIXES: dict[str, int] = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
"""A count of **parameters or elements** (``--params``, the DeepSpeed buckets), as model cards write them:
powers of 1,000 (7B = 7·10⁹, 124M, 1.5T; "G" a synonym of B)."""
BINARY_SUFFIXES: dict[str, int] = {"K": 2**10, "M": 2**20}
"""A count of **tokens or sequences** (``--seq-len``, ``--global-batch``, ``--tokens-per-step``), as context
lengths and batches are written: powers of 1,024 (8k = 8,192; Llama 3.1's 128k context = 131,072
``max_position_embeddings``; a batch of 4M tokens = 1,024 sequences of 4,096, which only 4·2²⁰ = 4,194,304
makes whole)."""
COUNT_RULE = (
    "k, M = 1,024, 1,048,576 for tokens and sequences (8k = 8,192); K, M, B, T = powers of 1,000 for "
    "parameters and elements (7B = 7,000,000,000)"
)
"""The one suffix rule, stated as every count option's help and the README state it."""

_NUMBER = r"[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
_COUNT_RE = re.compile(rf"^\s*(?P<num>[+-]?(?:{_NUMBER}))\s*(?P<suffix>[a-zA-Z]?)\s*$")
_BYTES_RE = re.compile(rf"^\s*(?P<num>[+-]?(?:{_NUMBER}))\s*(?P<unit>[A-Za-z]*)\s*$")
_BANDWIDTH_RE = re.compile(rf"^\s*(?P<num>[+-]?(?:{_NUMBER}))\s*(?P<unit>[A-Za-z]*)\s*(?:/\s*s)?\s*$")
_EXPONENT_LIMIT = 100
"""Numbers are read as decimals; an exponent beyond this (1e400) is refused before any arithmetic."""


def _decimal(number: str, what: str, accepted: str, original: object) -> Decimal:
    """``number`` (the numeric part of ``original``, what the user typed) as an exact decimal."""
    try:
        value = Decimal(number.replace("_", ""))
    except InvalidOperation as exc:  # pragma: no cover - the regexes only pass valid numbers
        raise InputError(f"{what} {shown(original)} is not a number; accepted: {accepted}") from exc
    if value and abs(value.adjusted()) > _EXPONENT_LIMIT:
        raise InputError(f"{what} {shown(original)} is out of range; accepted: {accepted}")
    return value


def _exact_int(value: Decimal, original: str, what: str, accepted: str) -> int:
    if value != value.to_integral_value():
        raise InputError(f"{what} {shown(original)} is not a whole number; accepted: {accepted}")
    return int(value)


PARAMS_ACCEPTED = "a positive count such as 7B, 6.7b, 124M, 1.5T, 6.7e9, 6_738_415_616 or 124439808"
MAX_COUNT = 10**16
"""The largest count accepted (10,000T parameters, tokens, elements): far beyond any model, and every
byte figure derived from it stays an exact integer that floats can still show."""


def parse_count(
    text: str | int,
    what: str = "{params}",
    accepted: str = PARAMS_ACCEPTED,
    maximum: int = MAX_COUNT,
    suffixes: dict[str, int] = SI_SUFFIXES,
) -> int:
    """Parse a positive count with an optional suffix into an exact integer: ``suffixes`` are
    :data:`SI_SUFFIXES` (parameters, elements) or :data:`BINARY_SUFFIXES` (tokens, sequences), the one rule
    :data:`COUNT_RULE` states; a letter of neither is refused."""
    if isinstance(text, bool):
        raise InputError(f"{what} {shown(text)} is not a count; accepted: {accepted}")
    if isinstance(text, int):
        count = text
    else:
        match = _COUNT_RE.match(str(text))
        factor = 1 if match is None or not match["suffix"] else suffixes.get(match["suffix"].upper())
        if match is None or factor is None:
            raise InputError(f"{what} {shown(text)} is not understood; accepted: {accepted}")
        value = _decimal(match["num"], what, accepted, text) * factor
        count = _exact_int(value, str(text), what, accepted)
    if count <= 0:
        raise InputError(f"{what} {shown(text)} must be positive; accepted: {accepted}")
    if count > maximum:
        raise InputError(f"{what} {shown(text)} is more than {maximum:,}; accepted: {accepted}")
    return count


_WHOLE_RE = re.compile(r"[+-]?[0-9]+")


def parse_whole(text: str | int, what: str, low: int, high: int, unit: str) -> int:
    """A whole number from ``low`` to ``high`` (``--gpus``, ``--seq-len``, ``--prefetch``...)."""
    accepted = f"a whole number of {unit} from {low:,} to {high:,}"
    if isinstance(text, bool):
        raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}")
    if isinstance(text, int):
        value = text
    else:
        stripped = str(text).strip().replace("_", "")
        # ASCII digits with one optional sign: str.isdigit() also passes '²', which int() refuses
        if not _WHOLE_RE.fullmatch(stripped) or len(stripped) > 30:
            raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}")
        value = int(stripped)
    if not low <= value <= high:
        raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}")
    return value


def parse_tokens(text: str | int, what: str, low: int, high: int) -> int:
    """A whole number of tokens from ``low`` to ``high``: ``8192``, or ``8k`` (× 1,024), ``1M`` (× 1,024²):
    :data:`BINARY_SUFFIXES`."""
    accepted = f"a whole number of tokens from {low:,} to {high:,}, or with k (1,024) or M (1,048,576): 8k"
    whole = text
    if isinstance(text, str) and not text.strip().replace("_", "").lstrip("+-").isdigit():
        try:
            whole = parse_count(text, what, accepted, suffixes=BINARY_SUFFIXES)
        except InputError:
            raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}") from None
    try:
        return parse_whole(whole, what, low, high, "tokens")
    except InputError:
        raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}") from None


def parse_fraction(text: str | float, what: str, low: float, high: float, accepted: str) -> float:
    """A finite number from ``low`` to ``high`` (``--tflops``)."""
    if isinstance(text, bool):
        raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(f"{what} {shown(text)} is not a number; accepted: {accepted}") from None
    if value != value or not low <= value <= high:  # nan, inf and out of range
        raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}")
    return value


BYTES_ACCEPTED = "a size with its unit, such as 80GiB, 80GB, 512MiB or 1.5TB"
MAX_BYTES = 2**60
"""The largest size accepted (1 EiB)."""


def parse_bytes(
    text: str | int,
    what: str = "{size}",
    accepted: str = BYTES_ACCEPTED,
    bare_unit: str | None = None,
    maximum: int = MAX_BYTES,
) -> int:
    """Parse a byte size such as ``80GiB`` or ``1.5TB`` into an exact integer number of bytes.

    A bare number (no unit) is ambiguous (``--gpu-memory 80``: bytes or GiB?) and is refused unless
    ``bare_unit`` says which unit it means (``"B"`` for ``bench --min-bytes``, which counts bytes), or it
    is zero (the same in every unit).
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {shown(text)} is not a size; accepted: {accepted}")
    if isinstance(text, int):
        value = text
    else:
        match = _BYTES_RE.match(str(text))
        if not match:
            raise InputError(f"{what} {shown(text)} is not understood; accepted: {accepted}")
        if not match["unit"] and bare_unit is None and _decimal(match["num"], what, accepted, text) != 0:
            raise InputError(f"{what} {shown(text)} has no unit; accepted: {accepted}")
        unit = _canonical_byte_unit(match["unit"] or bare_unit or "B")
        if unit is None:
            raise InputError(f"{what} {shown(text)} has an unknown unit; accepted: {accepted}")
        number = _decimal(match["num"], what, accepted, text) * _BYTE_FACTORS[unit]
        value = _exact_int(number, str(text), what, accepted)
    if value < 0:
        raise InputError(f"{what} {shown(text)} must not be negative; accepted: {accepted}")
    if value > maximum:
        raise InputError(f"{what} {shown(text)} is more than {maximum:,} bytes; accepted: {accepted}")
    return value


def _canonical_byte_unit(unit: str) -> str | None:
    if unit in ("", "b", "B"):
        return "B"
    for name in _BYTE_FACTORS:
        if unit.lower() == name.lower():
            # "KB" vs "KiB" differ by the "i"; case is otherwise forgiven (gb, Gib).
            return name
    return None


BANDWIDTH_ACCEPTED = "a rate with its unit, such as 450GB/s, 50 GB/s, 25GiB/s, 400Gbit/s or 400Gbps"
MAX_BANDWIDTH = 1e15
"""The fastest link accepted: 1 PB/s per GPU (NVLink 5 is 0.9 TB/s per direction)."""
MIN_BANDWIDTH = 1e6
"""The slowest link accepted: 1 MB/s per GPU (8 Mbit/s, below any network a job trains over)."""


def parse_bandwidth(text: str | float, what: str = "{bandwidth}") -> float:
    """Parse a bandwidth into bytes per second.

    ``B`` is bytes and ``b``/``bit`` is bits, as network specs write them: ``450GB/s`` (NVLink-class bus
    bandwidth), ``400Gb/s`` = ``400Gbit/s`` = ``400Gbps`` = 50 GB/s (an InfiniBand NDR port). A bare
    number has no unit and is refused from text; a float from the library is bytes per second.
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {shown(text)} is not a rate; accepted: {BANDWIDTH_ACCEPTED}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _BANDWIDTH_RE.match(str(text))
        if not match:
            raise InputError(f"{what} {shown(text)} is not understood; accepted: {BANDWIDTH_ACCEPTED}")
        if not match["unit"]:
            raise InputError(f"{what} {shown(text)} has no unit; accepted: {BANDWIDTH_ACCEPTED}")
        unit = match["unit"].removesuffix("ps")
        bits = False
        if unit.endswith("bit"):
            bits, unit = True, unit[: -len("bit")]
        elif unit.endswith("b"):
            bits, unit = True, unit[:-1]
        else:
            unit = unit.removesuffix("B")
        canonical = _canonical_byte_unit(unit + "B")
        if canonical is None:
            raise InputError(f"{what} {shown(text)} has an unknown unit; accepted: {BANDWIDTH_ACCEPTED}")
        number = _decimal(match["num"], what, BANDWIDTH_ACCEPTED, text)
        value = float(number * _BYTE_FACTORS[canonical] / (8 if bits else 1))
    if value != value or not MIN_BANDWIDTH <= value <= MAX_BANDWIDTH:
        raise InputError(
            f"{what} {shown(text)} is not accepted; accepted: {BANDWIDTH_ACCEPTED}, from 1 MB/s to 1 PB/s"
        )
    return value


UNITS_ACCEPTED = "GiB, GB, MiB, MB, TiB, TB, KiB, KB or B"


def parse_byte_unit(text: str, what: str = "{units}") -> ByteUnit:
    """Resolve ``--units`` (GB, GiB, MB, MiB, B, ...; case-insensitive apart from the binary ``i``)."""
    canonical = _canonical_byte_unit(text.strip()) if text.strip() else None
    if canonical is None:
        raise InputError(f"{what} {shown(text)} is not a unit; accepted: {UNITS_ACCEPTED}")
    return ByteUnit(canonical)


def format_bytes(n_bytes: int | float, unit: ByteUnit, digits: int = 2) -> str:
    """Render a byte count in ``unit`` (no unit suffix: tables say the unit in their header)."""
    if unit is ByteUnit.B:
        return f"{round(n_bytes):,}"
    return f"{n_bytes / unit.factor:,.{digits}f}"


def format_size(n_bytes: int) -> str:
    """A size in running text, in the largest binary unit it reaches: ``512 B``, ``1.0 MiB``, ``6.5 GiB``."""
    for unit in (ByteUnit.TiB, ByteUnit.GiB, ByteUnit.MiB, ByteUnit.KiB):
        if n_bytes >= unit.factor:
            return f"{n_bytes / unit.factor:,.1f} {unit.value}"
    return f"{n_bytes:,} B"


def format_count(count: int) -> str:
    """Render a parameter count the way model cards do: 6.74B, 124.44M."""
    for suffix, factor in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= factor:
            return (
                f"{count / factor:.3g}{suffix}" if count / factor < 100 else f"{count / factor:.4g}{suffix}"
            )
    return str(count)


def plural(count: int, word: str) -> str:
    """``1 GPU``, ``8 GPUs``: a count with its noun (regular plurals only)."""
    return f"{count} {word}{'' if count == 1 else 's'}"


_LONG_DURATIONS = ((86_400.0, "d"), (3_600.0, "h"), (60.0, "min"))


def format_seconds(seconds: float) -> str:
    """Render a duration with a unit fitting its size (µs, ms, s; min, h, d past a minute), at most four
    significant figures before the point: ``54.46 ms``, ``2.500 s``, ``1.9 h``, ``2.8e+05 d``; none at all
    is ``0 s``, with its unit like every other time."""
    if seconds == 0:
        return "0 s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    if seconds < 60:
        return f"{seconds:.3f} s"
    factor, unit = next((f, u) for f, u in _LONG_DURATIONS if seconds >= f)
    value = seconds / factor
    return f"{value:.1f} {unit}" if value < 10_000 else f"{value:.1e} {unit}"


def format_bandwidth(bytes_per_second: float) -> str:
    """Render a bandwidth in GB/s (decimal, as NCCL and nccl-tests report it)."""
    return f"{bytes_per_second / 1e9:.1f} GB/s"


def ceil_div(numerator: int, denominator: int) -> int:
    """Integer ceiling division for non-negative numerators."""
    return -(-numerator // denominator)


_DURATION_RE = re.compile(rf"^\s*(?P<num>[+-]?(?:{_NUMBER}))\s*(?P<unit>s|ms|us|µs|μs|ns)?\s*$")
_DURATION_FACTORS = {
    "s": Decimal(1),
    "ms": Decimal("1e-3"),
    "us": Decimal("1e-6"),
    "µs": Decimal("1e-6"),  # U+00B5 MICRO SIGN
    "μs": Decimal("1e-6"),  # U+03BC GREEK SMALL LETTER MU, which keyboards and some fonts give instead
    "ns": Decimal("1e-9"),
}
DURATION_ACCEPTED = "a duration such as 20us, 0.05ms or 2e-5 (seconds), from 0 to 10 s"
MAX_LATENCY_S = 10.0
"""The longest latency accepted per collective."""


def parse_duration(text: str | float, what: str = "{duration}", maximum: float = MAX_LATENCY_S) -> float:
    """Parse a non-negative duration into seconds; a bare number is seconds."""
    if isinstance(text, bool):
        raise InputError(f"{what} {shown(text)} is not a duration; accepted: {DURATION_ACCEPTED}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _DURATION_RE.match(str(text))
        if not match:
            raise InputError(f"{what} {shown(text)} is not understood; accepted: {DURATION_ACCEPTED}")
        number = _decimal(match["num"], what, DURATION_ACCEPTED, text)
        value = float(number * _DURATION_FACTORS[match["unit"] or "s"])
    if value != value or not 0 <= value <= maximum:
        raise InputError(f"{what} {shown(text)} is not accepted; accepted: {DURATION_ACCEPTED}")
    return value


def summary_repr(type_name: str, items: list[tuple[str, object]]) -> str:
    """A result in one line, for a notebook or a REPL: ``MemoryEstimate(params='7B', gpus=8, ddp='104.31
    GiB', ...)`` (its ``__rich_repr__`` yields the same items)."""
    return f"{type_name}({', '.join(f'{key}={value!r}' for key, value in items)})"


def gib(n_bytes: int | float) -> str:
    """A size in GiB for a one-line summary (``104.31 GiB``)."""
    return f"{format_bytes(n_bytes, ByteUnit.GiB)} GiB"
