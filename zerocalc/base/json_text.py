"""JSON files the user names (config.json, adapter_config.json, ds_config.json), read with one message set.

Each refusal is one line naming the file (``where``) and what is accepted (``accepted``: the format its
reader takes), the only part that differs between the readers.
"""

from __future__ import annotations

import json
from typing import Any

from zerocalc.base.errors import InputError


def json_value(raw: str | bytes, where: str, accepted: str) -> Any:
    """The JSON value of a file's text or bytes (UTF-8, a byte-order mark allowed)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{where} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                f"accepted: {accepted} in UTF-8"
            ) from exc
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        problem = f"{exc.msg} at line {exc.lineno}"
        raise InputError(f"{where} is not JSON ({problem}); accepted: {accepted}") from exc
    except (ValueError, RecursionError) as exc:  # a number of more than 4300 digits, nesting too deep
        message = f"{where} is not a JSON file this reader accepts ({exc}); accepted: {accepted}"
        raise InputError(message) from exc


def json_object(raw: str | bytes, where: str, accepted: str) -> dict[str, Any]:
    """The JSON object of a file's text or bytes; any other JSON value is refused."""
    value = json_value(raw, where, accepted)
    if not isinstance(value, dict):
        raise InputError(f"{where} is not a JSON object; accepted: {accepted}")
    return value
