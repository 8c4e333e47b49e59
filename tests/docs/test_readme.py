"""README's Quick start stays true: CI runs README's test command verbatim."""

from __future__ import annotations

import re

from helpers import ROOT


def _quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_quick_start_has_exactly_two_commands() -> None:
    commands = _quick_start_commands()
    assert len(commands) == 2
    assert "zerocalc memory --params 7B --gpus 4" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _quick_start_commands()[1] in ci_lines


def test_the_library_example_runs_as_written() -> None:
    """Every ``>>>`` line of README's Python blocks runs and prints what the README says."""
    import doctest

    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if ">>>" in b]
    assert blocks, "README has no library example"
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for i, block in enumerate(blocks):
        runner.run(parser.get_doctest(block, {}, f"README block {i}", "README.md", 0))
    results = runner.summarize(verbose=False)
    assert results.failed == 0 and results.attempted > 0


def test_every_package_is_installed_by_pip_install_dot() -> None:
    """Quick start 1 installs with ``pip install .`` (not editable): setuptools installs only the packages
    pyproject.toml lists, so every folder of ``zerocalc/`` with an ``__init__.py`` must be among them (a
    missing one makes its commands fail with ModuleNotFoundError after a real install)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "zerocalc").rglob("__init__.py")
    }
    assert packages - listed == set()


def test_readme_is_at_most_350_lines() -> None:
    """README is the user's five-minute read; the method and its sources live in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350
