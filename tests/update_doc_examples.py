"""Rewrite the output of every console example in README.md and docs/*.md from a fresh run, and the
JSON field tables (``<!-- schema: MODEL -->``) from the pydantic models.

    python tests/update_doc_examples.py            # every example (bench and validate start torch processes)
    python tests/update_doc_examples.py --fast     # leave bench and validate outputs as they are
    python tests/update_doc_examples.py docs/model.md

Commands run as tests/docs/test_doc_examples.py runs them (in-process, 80 columns). An
output with a ``...`` line keeps as many first and last lines as it shows; an output that differs only in
what the test masks (timings, measured figures) is left as it is. Each page is written
atomically and only when an output changed; the pages changed are printed.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent / "docs")]

from test_doc_examples import (  # noqa: E402 (found on the path set above)
    PAGES,
    ROOT,
    RUNS_PROCESSES,
    as_shown,
    examples,
    normalise,
    run,
    schema_tables,
    schemas,
    shown_parts,
)


def same(args: list[str], shown: str, fresh: str) -> bool:
    """Whether the test would accept ``shown`` for ``fresh`` (the masked parts aside)."""
    if shown_parts(shown)[1] is None or shown_parts(fresh)[1] is None:
        return normalise(args, shown) == normalise(args, fresh)
    return all(
        normalise(args, "\n".join(a)) == normalise(args, "\n".join(b))
        for a, b in zip(shown_parts(shown), shown_parts(fresh), strict=True)
    )


def schemas_of(text: str) -> list[tuple[str, str, int, int]]:
    with tempfile.NamedTemporaryFile("w", suffix=".md") as handle:
        handle.write(text)
        handle.flush()
        return schemas(Path(handle.name))


def update(page: Path, fast: bool) -> bool:
    """Rewrite ``page``'s example outputs; True when it changed."""
    text = page.read_text()
    pieces, last = [], 0
    for example in examples(page):
        if fast and example.args[0] in RUNS_PROCESSES:
            continue
        with tempfile.TemporaryDirectory() as cwd:
            code, output = run(example.args, Path(cwd))
        if code != 0:
            print(f"{example.where}: `zerocalc {example.command}` exited {code}", file=sys.stderr)
        fresh = as_shown(example.shown, output)
        if same(example.args, example.shown, fresh):
            fresh = example.shown  # only timings or measurements differ: keep the page as it is
        pieces += [text[last : example.start], fresh + "\n"]
        last = example.end
    text = "".join(pieces) + text[last:]
    pieces, last = [], 0
    for model, _, start, end in schemas_of(text):
        pieces += [text[last:start], schema_tables(model)]
        last = end
    new = "".join(pieces) + text[last:]
    text = page.read_text()
    if new == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=page.parent, prefix=f".{page.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(new)
    os.chmod(tmp, page.stat().st_mode & 0o777)
    os.replace(tmp, page)
    return True


def main(argv: list[str]) -> int:
    fast = "--fast" in argv
    named = [ROOT / a if not Path(a).is_absolute() else Path(a) for a in argv if a != "--fast"]
    for page in named or PAGES:
        if update(page.resolve(), fast):
            print(f"updated {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
