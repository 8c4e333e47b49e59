"""The JSON files a user names — a model's config.json, PEFT's adapter_config.json, a DeepSpeed config — are
refused alike when they are not a JSON object: one line naming the flag, the file and the format accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app

BROKEN = [
    ("{", "is not JSON (Expecting property name enclosed in double quotes at line 1); accepted:"),
    ("[1, 2]", "object"),
    (b"\xff{}", "byte 0xff"),
    ('{"a": ' + "9" * 5000 + "}", "is not a JSON file this reader accepts"),
]
READERS = [
    ("--model", "config.json", "a Hugging Face config.json"),
    ("--adapter-config", "adapter_config.json", "PEFT's adapter_config.json"),
    ("--deepspeed", "ds_config.json", "a ds_config.json"),
]


@pytest.mark.parametrize(("flag", "name", "accepted"), READERS)
@pytest.mark.parametrize(("content", "problem"), BROKEN)
def test_a_json_file_that_is_not_an_object_is_refused_in_one_line_naming_its_format(
    tmp_path: Path, flag: str, name: str, accepted: str, content: str | bytes, problem: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    model = [] if flag == "--model" else ["--model", "llama-3-8b"]
    result = CliRunner().invoke(app, ["memory", *model, "--gpus", "8", flag, str(path)])
    line = one_line_error(result, problem)
    assert str(path) in line and "{" + flag not in line, line
    if content in ("{", BROKEN[-1][0]):  # not JSON: each reader names its format
        assert line.endswith(f"accepted: {accepted}"), line
