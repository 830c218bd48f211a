"""Query parameters: one parse step from the path and `data` to typed values or `QueryError`.

Used by every route module (`queries.py`, `payout_queries.py`). Parameters come from the path's
query string (`/nodes?model=m&shard=1`) and/or a JSON object in the request's `data` (merged
over it). Typed per route: strings ≤ 256 chars (matching a pattern when given), integers as JSON
integers or ASCII digits within bounds, booleans as JSON booleans or `true`/`false`; a wrong
type or range is BAD_QUERY.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from abci_app.codes import Code
from protocol.canonical import JsonInputError, parse_json
from protocol.fields import Fields

MAX_ITEMS = 1000  # most records one list query answers (?limit lowers it)
MAX_PATH = 4096  # characters of path + query string
MAX_DATA = 4096  # bytes of the JSON `data` object
MAX_PARAMS = 32
MAX_INT = (1 << 63) - 1
MAX_STR = 256

NODE_KEY = re.compile(r"[0-9a-f]{64}\Z")
HASH32 = re.compile(r"0x[0-9a-f]{64}\Z")
# a commitment record's key: node / session / step / shard (a page cursor of /commitments)
COMMITMENT_KEY = re.compile(r"[0-9a-f]{64}/0x[0-9a-f]{64}/[0-9]{1,20}/[0-9]{1,10}\Z")
# a price record's key: node / shard, 5 digits (a page cursor of /prices)
PRICE_CURSOR = re.compile(r"[0-9a-f]{64}/[0-9]{5}\Z")
ACCOUNT = re.compile(r"0x[0-9a-fA-F]{40}\Z")
DIGITS = re.compile(r"[0-9]{1,19}\Z")  # ASCII only: str.isdigit/int accept other scripts


class QueryError(Exception):
    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_check = Fields(lambda message: QueryError(Code.BAD_QUERY, message))


def parse_params(path: str, data: bytes) -> tuple[str, dict[str, Any]]:
    """(route path, parameters) from the query path and JSON `data`; raises QueryError."""
    if len(path) > MAX_PATH:
        raise QueryError(Code.BAD_QUERY, f"query path over {MAX_PATH} characters")
    try:
        parts = urlsplit(path)
        params: dict[str, Any] = dict(parse_qsl(parts.query, max_num_fields=MAX_PARAMS))
    except ValueError:
        raise QueryError(Code.BAD_QUERY, "bad query string") from None
    if data:
        try:
            extra = parse_json(data, max_bytes=MAX_DATA, max_depth=1, max_int_digits=19)
        except JsonInputError as error:
            raise QueryError(Code.BAD_QUERY, f"query data: {error.message}") from None
        if not isinstance(extra, dict) or len(extra) > MAX_PARAMS:
            raise QueryError(Code.BAD_QUERY, "query data must be a JSON object")
        params.update(extra)
    return parts.path.rstrip("/") or "/", params


def int_param(
    params: dict[str, Any], name: str, default: int | None = None, lo: int = 0, hi: int = MAX_INT
) -> int | None:
    """An integer parameter: a JSON integer or ASCII digits, within [lo, hi]."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, str) and DIGITS.match(value):
        value = int(value)
    return _check.integer(value, name, lo, hi)


def str_param(
    params: dict[str, Any], name: str, pattern: re.Pattern[str] | None = None
) -> str | None:
    """A string parameter (≤ 256 chars, matching `pattern` when given)."""
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_STR:
        raise QueryError(Code.BAD_QUERY, f"{name}: expected a string of ≤ {MAX_STR} chars")
    if pattern is not None and not pattern.match(value):
        raise QueryError(Code.BAD_QUERY, f"{name}: bad value {ascii(value)[:80]}")
    return value


def bool_param(params: dict[str, Any], name: str) -> bool | None:
    value = params.get(name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise QueryError(Code.BAD_QUERY, f"{name}: expected true or false")


def limit_param(params: dict[str, Any]) -> int:
    """`limit`: 1 … MAX_ITEMS (larger values are capped, as before; 0 means the maximum)."""
    value = int_param(params, "limit", MAX_ITEMS) or MAX_ITEMS
    return max(1, min(value, MAX_ITEMS))
