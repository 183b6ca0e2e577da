"""The one TOML writer of the case files: plain data -> the compact layout the cases are read in.

tomli_w formats every scalar (strings, numbers, booleans); this module only lays them out the
way a person writes a case file: arrays and nested tables on one line (a prompt is one line,
not one line per token), top-level tables as `[name]`, lists of tables as `[[name.key]]`, and
an optional `#` comment at the top. Every document is parsed back and compared with its data,
so the layout can never change what a file means.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

import tomli_w


def toml_document(data: Mapping[str, Any], comment: str | None = None) -> str:
    """{key: value} -> TOML text: top-level keys, then one `[table]` (and its `[[table.key]]`s) per dict.

    Blocks are separated by one blank line; `comment` lines come first, with no blank line after.
    """
    keys = {k: v for k, v in data.items() if not isinstance(v, Mapping)}
    blocks = [_lines(keys)] if keys else []
    blocks += [_table(name, table) for name, table in data.items() if isinstance(table, Mapping)]
    text = "".join(f"# {line}\n" for line in (comment or "").splitlines()) + "\n".join(blocks)
    if tomllib.loads(text) != _plain(data):
        raise ValueError(f"the TOML layout changed the data; text was:\n{text}")
    return text


def toml_value(value: Any) -> str:
    """One value on one line: arrays and tables inline; scalars exactly as tomli_w writes them."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    line = tomli_w.dumps({"v": value})  # 'v = <literal>\n'
    return line[len("v = ") : -1]


def toml_table(data: Mapping[str, Any]) -> str:
    """{key: value} -> `key = value` lines, every value inline."""
    return _lines(data)


def _table(name: str, table: Mapping[str, Any]) -> str:
    """`[name]` with its inline keys, then each list of tables under it as `[[name.key]]` blocks."""
    aots = {k: v for k, v in table.items() if _is_table_list(v)}
    keys = {k: v for k, v in table.items() if k not in aots}
    blocks = [f"[{_key(name)}]\n" + _lines(keys)] if keys or not aots else []
    for key, items in aots.items():
        blocks += [f"[[{_key(name)}.{_key(key)}]]\n" + _lines(item) for item in items]
    return "\n".join(blocks)


def _lines(data: Mapping[str, Any]) -> str:
    return "".join(f"{_key(k)} = {toml_value(v)}\n" for k, v in data.items())


def _key(key: str) -> str:
    return tomli_w.dumps({key: 0})[: -len(" = 0\n")]


def _is_table_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _plain(value: Any) -> Any:
    """Tuples as lists, as tomllib reads them back."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
