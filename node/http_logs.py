"""aiohttp's server log, for processes that strangers can reach (nodes, the gateway)."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError


class MalformedHttpLogFilter(logging.Filter):
    """aiohttp logs every request it cannot parse with a full traceback at ERROR; strangers
    could fill the log with them. Such records become one INFO line without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            text = str(getattr(error, "message", "") or error)
            first = next((line for line in text.splitlines() if line.strip()), "")
            record.msg = "malformed HTTP refused: %s: %s"
            record.args = (type(error).__name__, first[:120])
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def quiet_malformed_http_logs() -> None:
    """Install MalformedHttpLogFilter on aiohttp's server logger (once)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHttpLogFilter) for f in server_log.filters):
        server_log.addFilter(MalformedHttpLogFilter())
