"""kiln's loggers: one ``kiln`` hierarchy, text or JSON lines, and the request id every server log line carries.

``get_logger("serve.batcher")`` is ``logging.getLogger("kiln.serve.batcher")``; ``configure()`` installs one
handler on ``kiln`` (and on uvicorn's loggers, so access lines and kiln's own lines share a format). The request
id of the HTTP request being handled lives in a context variable: set by the server's request-id middleware,
copied into tasks the request spawns, and stamped on every record by :class:`RequestIdFilter`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

from kiln.choices import LogFormatName, parse_choice

ROOT = "kiln"
# Loggers configured together with kiln's: uvicorn's start-up/error lines and its access log.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("kiln_request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and goes into the JSON line.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "request_id"}


def get_logger(name: str) -> logging.Logger:
    """The logger ``kiln.<name>``."""
    return logging.getLogger(f"{ROOT}.{name}" if name else ROOT)


class RequestIdFilter(logging.Filter):
    """Stamps ``record.request_id`` from the context (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get()
        return True


def _access_fields(record: logging.LogRecord) -> dict[str, Any]:
    """uvicorn's access records carry (client, method, path, http version, status) as their args."""
    if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        client, method, path, version, status = record.args
        return {"client": client, "method": method, "path": path, "http_version": version, "status": status}
    return {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, any ``extra=`` fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", None):
            line["request_id"] = record.request_id
        line.update(_access_fields(record))
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """``LEVEL logger [request id] message``, uvicorn's access lines in the same shape."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s%(rid)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # A copy: the record is shared with every other handler (a test's caplog, a second sink), which must see
        # it as it was logged.
        record = logging.makeLogRecord(record.__dict__)
        rid = getattr(record, "request_id", None)
        record.rid = f" [{rid}]" if rid else ""
        access = _access_fields(record)
        if access:  # the same fields as the JSON line, instead of uvicorn's colourised access format
            record.msg, record.args = "%s %s %s -> %s", (access["client"], access["method"], access["path"],
                                                          access["status"])
        return super().format(record)


FORMATTERS: dict[LogFormatName, type[logging.Formatter]] = {LogFormatName.TEXT: TextFormatter,
                                                            LogFormatName.JSON: JsonFormatter}


def formatter(log_format: str) -> logging.Formatter:
    return FORMATTERS[parse_choice(LogFormatName, log_format, "log_format")]()


def configure(log_format: str = "text", level: int | str = logging.INFO, stream: Any = None) -> logging.Handler:
    """Send kiln's and uvicorn's records to one handler (stderr by default) in ``log_format``; returns it.

    Idempotent: a second call replaces the handler the first installed instead of adding another.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(RequestIdFilter())
    handler.set_name("kiln")
    for name in (ROOT, *UVICORN_LOGGERS):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == "kiln" or name.startswith("uvicorn")]:
            logger.removeHandler(old)
        if name in (ROOT, "uvicorn"):  # uvicorn.error and uvicorn.access propagate to "uvicorn"
            logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = name != ROOT and name != "uvicorn"
    return handler
