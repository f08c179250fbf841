"""Logging set-up: one line per event, `text` or `json` (docs/reference.md).

Code logs a short event message plus structured fields:
`log.info("instance created", extra={"proxy": "ns/name", "instance": iid})`.
Never pass a token, a Secret value or a cloud-init body as a field.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

from egressd.timestamps import format_wall

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": format_wall(record.created, precision="milli"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """`TIME LEVEL logger: msg key=value ...` for humans."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} "
            f"{record.name}: {record.getMessage()}"
        )
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        if extra:
            line += " " + extra
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Route every egressd logger to one handler with the chosen format."""
    import time

    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = JSONFormatter() if fmt == "json" else TextFormatter()
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("egressd").setLevel(level.upper())
