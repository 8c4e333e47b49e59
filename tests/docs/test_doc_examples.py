"""Every command example in README.md and docs/*.md runs and prints what the page shows.

An example is a fenced ``console`` block: lines starting with ``$ zerocalc`` are commands (a line ending
in ``\\`` continues on the next), the lines after a command up to the next ``$`` line are its output.
Each command runs in-process through Typer's runner at a fixed width (``COLUMNS=80``, ``NO_COLOR``), in
the repository's root (``bench`` and ``validate``, which may write files, in an empty temporary
directory); the output is stdout, or stdout then stderr when the command fails.
Outputs are compared exactly, trailing spaces aside, except what varies from run to run (see
:func:`normalise`): the search time and rate of ``plan``, the seconds per configuration of ``validate``,
the measured times and bandwidths of ``bench``, and the repository's path. One line ``...`` in an output
stands for lines left out: the lines above it are the output's first lines, the lines below it its last.
Commands shown without output (fenced ``bash`` blocks: torchrun, srun, a GPU) are parsed, so their
options exist.

``python tests/update_doc_examples.py`` rewrites every output in place from a fresh run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

RUNS_PROCESSES = {"bench", "validate"}
"""Commands that start torch processes: their examples are marked slow."""

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Example:
    """One ``$ zerocalc`` command of a console block and the output the page shows for it."""

    page: Path
    line: int  # 1-based line of the ``$`` line in the page
    command: str  # as written, continuation lines joined
    shown: str  # the output lines under it, joined by newlines
    start: int  # character offsets of the output in the page text (for rewriting)
    end: int

    @property
    def args(self) -> list[str]:
        words = shlex.split(self.command)
        assert words[0] == "zerocalc", f"{self.where}: a console example runs zerocalc, not {words[0]}"
        return words[1:]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The console examples of ``page``, in order."""
    text = page.read_text()
    found = []
    for fence in _FENCE.finditer(text):
        if fence.group(1) != "console":
            continue
        body_start = fence.start(2)
        lines = fence.group(2).splitlines(keepends=True)
        offset = body_start
        i = 0
        assert lines and lines[0].startswith("$ "), f"{page.name}: a console block starts with a $ line"
        while i < len(lines):
            line_no = text.count("\n", 0, offset) + 1
            command = lines[i][2:].rstrip("\n")
            offset += len(lines[i])
            i += 1
            while command.endswith("\\"):
                command = command[:-1].rstrip() + " " + lines[i].strip()
                offset += len(lines[i])
                i += 1
            start = offset
            output = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                offset += len(lines[i])
                i += 1
            found.append(Example(page, line_no, command, "".join(output).rstrip("\n"), start, offset))
    return found


def commands_only(page: Path) -> list[tuple[int, list[str]]]:
    """Every ``zerocalc …`` command in the page's ``bash`` blocks (line, arguments after ``zerocalc``),
    including ``-m zerocalc …`` under torchrun or srun."""
    text = page.read_text()
    found = []
    for fence in _FENCE.finditer(text):
        if fence.group(1) != "bash":
            continue
        first_line = text.count("\n", 0, fence.start(2)) + 1
        joined = fence.group(2).replace("\\\n", " ")
        for n, line in enumerate(joined.splitlines()):
            code = line.split(" # ", 1)[0].strip()
            words = shlex.split(code) if code else []
            for i, word in enumerate(words):
                if word == "zerocalc" and (
                    i == 0 or words[i - 1] in ("-m", "&&", ";") or "srun" in words[:i]
                ):
                    found.append((first_line + n, _before_shell_operator(words[i + 1 :])))
                    break
    return found


def _before_shell_operator(words: list[str]) -> list[str]:
    for i, word in enumerate(words):
        if word in ("&&", "||", "|", ";", ">", "2>"):
            return words[:i]
    return words


def run(args: list[str], scratch: Path) -> tuple[int, str]:
    """Run ``zerocalc ARGS`` as the examples are run; the exit code and what the page shows."""
    import os

    from typer.testing import CliRunner

    from zerocalc.cli import app

    cwd = scratch if args[:1] and args[0] in RUNS_PROCESSES else ROOT

    env: dict[str, str | None] = {
        "COLUMNS": "80",
        "NO_COLOR": "1",
        "FORCE_COLOR": None,
        "TTY_COMPATIBLE": None,
    }
    env["ZEROCALC_PRESETS"] = None  # the repository's presets
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, args, env=env, terminal_width=80)
    finally:
        os.chdir(previous)
    output = result.stdout
    if result.exit_code != 0:
        output += result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, "\n".join(line.rstrip() for line in output.splitlines()).replace(str(ROOT), ".")


_TIMINGS = [
    (re.compile(r"\bin \d+(?:\.\d+)? s\b"), "in <seconds> s"),  # plan: search and exact-row times
    (re.compile(r"\([\d,]+/s\)"), "(<rate>/s)"),  # plan: candidates per second
    (re.compile(r"\(\d+(?:\.\d+)? s\)"), "(<seconds> s)"),  # validate: seconds per configuration
]
_MEASURED = [
    (re.compile(r"\bon .+?, world \d"), "on <device>, world"),  # bench: the device's name
    (re.compile(r"\btorch \d\S*"), "torch <version>"),
    (re.compile(r"\d[\d,]*\.\d+\*?"), "<measured>"),  # bench: times, bandwidths and fits
]
_BOX = re.compile(r"[┏┓┗┛┡┩┢┪┣┫┳┻╇╈╋┃━│─┌┐└┘├┤┬┴┼╭╮╰╯]+")


_BENCH_FALLBACK = re.compile(r"^· \* β is the peak busbw, not a fit: .*?fits it\n?", re.S | re.M)
"""bench: whether a short, noisy sweep's slope comes out positive (else β is the peak busbw, marked *)."""


def without_varying_lines(args: list[str], output: str) -> str:
    """``output`` without the lines that come and go with a measurement (bench's β fallback note)."""
    return _BENCH_FALLBACK.sub("", output) if args[:1] == ["bench"] else output


def normalise(args: list[str], output: str) -> str | list[str]:
    """What of ``output`` must equal the page: all of it but trailing spaces, except

    * where a line may wrap differently because a figure varies (``plan``, ``validate``, a path), the
      text with every run of spaces and newlines as one space and the figures as placeholders;
    * ``bench``, whose measured figures change its tables' column widths and the wrapping of their
      headers: the sorted words of its output, box drawing left out, measured figures as placeholders
      (every size, count, label, message and option name still compared)."""
    text = "\n".join(line.rstrip() for line in output.splitlines())
    command = args[0] if args else ""
    if command == "bench":
        flat = " ".join(text.split())
        for pattern, placeholder in _MEASURED:
            flat = pattern.sub(placeholder, flat)
        return sorted(_BOX.sub(" ", flat).split())
    if command in ("plan", "validate", "check") or "./" in text:
        flat = " ".join(text.split())
        for pattern, placeholder in _TIMINGS:
            flat = pattern.sub(placeholder, flat)
        return flat
    return text


_SCHEMA = re.compile(r"^<!-- schema: ([\w.]+) -->\n(.*?)^<!-- /schema -->$", re.S | re.M)


def _class(dotted: str) -> Any:
    import importlib

    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _type_text(annotation: Any, nested: list[Any]) -> str:
    """A field's JSON type as the tables write it; models met on the way are appended to ``nested``."""
    import enum
    import types
    import typing

    from pydantic import BaseModel

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(a, nested) for a in args)
    if annotation is type(None):
        return "null"
    if origin in (list, tuple):
        return f"[{_type_text(args[0], nested)}]"
    if origin is dict:
        return f"{{{_type_text(args[0], nested)}: {_type_text(args[1], nested)}}}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in nested:
            nested.append(annotation)
        return f"`{annotation.__name__}`"
    return {int: "int", float: "float", str: "str", bool: "bool"}.get(annotation, str(annotation))


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def schema_tables(dotted: str) -> str:
    """The field tables of the pydantic model ``dotted`` and of every model it holds, from the models
    themselves (each field's description is its docstring or ``Field(description=...)``)."""
    nested = [_class(dotted)]
    parts = []
    for model in nested:  # grows while it is walked
        rows = [
            f"| `{name}` | {_type_text(field.annotation, nested)} | {_one_line(field.description)} |"
            for name, field in model.model_fields.items()
        ]
        parts.append(
            "\n".join(
                [f"`{model.__name__}`:", "", "| field | type | meaning |", "| --- | --- | --- |", *rows]
            )
        )
    return "\n\n".join(parts) + "\n"


def schemas(page: Path) -> list[tuple[str, str, int, int]]:
    """The generated schema sections of ``page``: (model, text shown, start, end offsets of the text)."""
    return [(m.group(1), m.group(2), m.start(2), m.end(2)) for m in _SCHEMA.finditer(page.read_text())]


def _all_examples() -> list[Any]:
    params = []
    for page in PAGES:
        for example in examples(page):
            marks = [pytest.mark.slow] if example.args[:1] and example.args[0] in RUNS_PROCESSES else []
            params.append(pytest.param(example, id=example.where, marks=marks))
    return params


def test_readme_shows_every_command() -> None:
    from zerocalc.cli import COMMANDS

    readme = {e.args[0] for e in examples(ROOT / "README.md")}
    assert set(COMMANDS) <= readme, f"README has no example of {sorted(set(COMMANDS) - readme)}"
    assert any("--model" in e.args for e in examples(ROOT / "README.md") if e.args[0] == "memory")


ELISION = "..."
"""An output line standing for the lines left out between the first lines shown and the last."""


def shown_parts(shown: str) -> tuple[list[str], list[str] | None]:
    """The lines shown above the elision and below it (None: nothing left out)."""
    lines = shown.splitlines()
    if ELISION not in lines:
        return lines, None
    at = lines.index(ELISION)
    assert ELISION not in lines[at + 1 :], "one elision per output"
    return lines[:at], lines[at + 1 :]


def as_shown(shown: str, output: str) -> str:
    """``output`` cut as ``shown`` is: the same number of first and last lines around the elision."""
    head, tail = shown_parts(shown)
    lines = output.splitlines()
    if tail is None:
        return output
    return "\n".join([*lines[: len(head)], ELISION, *lines[len(lines) - len(tail) :]])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_code_block_is_run_or_parsed(page: Path) -> None:
    """A code block is ``console`` (run), ``bash`` (its zerocalc commands parsed), ``toml`` (a model file,
    read by :func:`test_every_toml_block_is_a_model_file`) or README's ``python`` library example (run by
    tests/docs/test_readme.py): no block escapes the tests unmarked."""
    allowed = {"console", "bash", "toml"} | ({"python"} if page.name == "README.md" else set())
    languages = [fence.group(1) for fence in _FENCE.finditer(page.read_text())]
    assert set(languages) <= allowed, f"{page.name}: code blocks marked {languages}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_toml_block_is_a_model_file(page: Path, tmp_path: Path) -> None:
    """A ``toml`` block is a model file `--model path/to/model.toml` reads as it stands."""
    from zerocalc.request.presets import load_model

    blocks = [fence.group(2) for fence in _FENCE.finditer(page.read_text()) if fence.group(1) == "toml"]
    for i, block in enumerate(blocks):
        path = tmp_path / f"block-{i}.toml"
        path.write_text(block)
        load_model(str(path))


@pytest.mark.parametrize("example", _all_examples())
def test_example_prints_what_the_page_shows(example: Example, tmp_path: Path) -> None:
    _, output = run(example.args, tmp_path)
    output = without_varying_lines(example.args, output)
    head, tail = shown_parts(without_varying_lines(example.args, example.shown))
    lines = output.splitlines()
    if tail is None:
        got, want = [normalise(example.args, output)], [normalise(example.args, example.shown)]
    else:
        assert len(lines) > len(head) + len(tail), f"{example.where}: the output is shorter than shown"
        got = [
            normalise(example.args, "\n".join(part))
            for part in (lines[: len(head)], lines[len(lines) - len(tail) :])
        ]
        want = [normalise(example.args, "\n".join(part)) for part in (head, tail)]
    assert got == want, (
        f"{example.where}: `zerocalc {example.command}` prints\n{output}\n"
        "(python tests/update_doc_examples.py rewrites the page's outputs)"
    )


@pytest.mark.parametrize(
    ("page", "model"),
    [pytest.param(page, model, id=f"{page.name}:{model}") for page in PAGES for model, *_ in schemas(page)],
)
def test_schema_tables_are_the_models(page: Path, model: str) -> None:
    """Every field table of docs/json-schema.md lists exactly the fields the JSON has (the tables are
    generated from the pydantic models by tests/update_doc_examples.py)."""
    shown = next(text for name, text, *_ in schemas(page) if name == model)
    assert shown == schema_tables(model), f"{page.name}: the fields of {model} changed"


def _commands_only() -> list[Any]:
    return [
        pytest.param(args, id=f"{page.relative_to(ROOT)}:{line}")
        for page in PAGES
        for line, args in commands_only(page)
    ]


@pytest.mark.parametrize("args", _commands_only())
def test_command_without_output_parses(args: list[str]) -> None:
    """A command shown without its output (it needs torchrun, several nodes or a GPU) names a command and
    options that exist: the command line's parser accepts it (the values are checked when it runs)."""
    import typer.main

    from zerocalc.cli import app

    command: Any = typer.main.get_command(app)
    rest = list(args)
    while hasattr(command, "commands"):  # a group: the next word names one of its commands
        assert rest and rest[0] in command.commands, f"no command {rest[:1]} in {sorted(command.commands)}"
        name, rest = rest[0], rest[1:]
        command = command.commands[name]
    command.make_context(command.name or "zerocalc", rest)


_PATH = re.compile(r"`((?:zerocalc|tests|benchmarks|presets|docs)/[^`\s]*)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page: Path) -> None:
    """Files and folders named in the pages (`zerocalc/peak/ledger.py`, `presets/models/*.toml`) exist."""
    missing = []
    for path in _PATH.findall(page.read_text()):
        path = path.split("::")[0].rstrip(".,;:")
        if any(c in path for c in "*<>…") or "NAME" in path:
            path = path.rsplit("/", 1)[0]
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


OTHER_TOOLS_OPTIONS = {
    "--help",
    "--nnodes",  # torchrun and srun
    "--nproc-per-node",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--standalone",
    "--max-restarts",
    "--max",
    "--nodes",
    "--ntasks-per-node",
    "--fast",  # tests/update_doc_examples.py
    "--repeat",  # benchmarks/plan.py
    "--baseline",  # benchmarks/plan.py
    "--tool",  # valgrind
    "--runs",  # benchmarks/startup.py
    *("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"),  # chromium (docs/pictures.md)
    *("--user-data-dir", "--screenshot", "--window-size"),
}


def _zerocalc_options() -> set[str]:
    import typer.main

    from zerocalc.cli import app

    options: set[str] = set()
    pending: list[Any] = [typer.main.get_command(app)]
    while pending:
        command = pending.pop()
        for param in command.params:
            options.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
        pending.extend(getattr(command, "commands", {}).values())  # a group: its commands
    return options


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_option_a_page_names_exists(page: Path) -> None:
    """Every ``--option`` the page names is an option of some zerocalc command (or of torchrun, srun and
    the repository's scripts), so a renamed or removed option cannot stay in the documentation."""
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", page.read_text()))
    unknown = named - _zerocalc_options() - OTHER_TOOLS_OPTIONS
    assert not unknown, f"{page.name} names options no command has: {sorted(unknown)}"


def test_examples_are_read_as_written(tmp_path: Path) -> None:
    """Continuation lines join a command; each command's output ends at the next ``$`` line; an elided
    output keeps as many first and last lines as the page shows."""
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```console\n$ zerocalc memory \\\n    --params 7B\nout 1\nout 2\n"
        "$ zerocalc presets list gpus\nfirst\n...\nlast\n```\n```bash\nzerocalc check --update  # note\n```\n"
    )
    first, second = examples(page)
    assert (first.command, first.args, first.shown, first.line) == (
        "zerocalc memory --params 7B",
        ["memory", "--params", "7B"],
        "out 1\nout 2",
        3,
    )
    assert page.read_text()[first.start : first.end] == "out 1\nout 2\n"
    assert second.args == ["presets", "list", "gpus"] and shown_parts(second.shown) == (["first"], ["last"])
    assert as_shown(second.shown, "a\nb\nc\nd") == "a\n...\nd"
    assert commands_only(page) == [(13, ["check", "--update"])]


def test_normalise_masks_only_what_varies() -> None:
    """The masks cannot hide a changed result: a plan row's figure or a bench size still differs."""
    shown = "Searched 284 candidates in 0.02 s (11,381/s), each\n│ 1. fsdp2 │ 69.01 │"
    rerun = "Searched 284 candidates in 0.06 s\n(4,877/s), each │ 1. fsdp2 │ 69.01 │"
    assert normalise(["plan"], shown) == normalise(["plan"], rerun)
    assert normalise(["plan"], shown) != normalise(["plan"], shown.replace("69.01", "69.02"))
    bench = "gloo on AMD EPYC, world 2 (1 node), torch 2.13.0+cpu\n│ 1,024 │ 512 │ 2,353.1 │ 0.000 │"
    other = "gloo on Intel Xeon, world 2 (1 node), torch 2.11.0\n│ 1,024 │ 512 │ 338.6 │ 0.012 │"
    assert normalise(["bench"], bench) == normalise(["bench"], other)
    assert normalise(["bench"], bench) != normalise(["bench"], bench.replace("1,024", "2,048"))
    assert normalise(["memory"], "a  \nb") == "a\nb" != normalise(["memory"], "a\n b")
