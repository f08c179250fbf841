"""Log lines: one per event, text or JSON, structured fields included."""

import io
import json
import logging

from egressd import logs


def emit(fmt: str) -> str:
    stream = io.StringIO()
    logs.setup("info", fmt, stream=stream)
    log = logging.getLogger("egressd.test")
    log.info("instance created", extra={"proxy": "ns/a", "instance": "px-1"})
    log.debug("not shown at info")
    logging.getLogger("some.library").info("libraries stay at warning")
    return stream.getvalue()


def test_json_is_one_object_per_line_with_fields() -> None:
    (line,) = emit("json").splitlines()
    record = json.loads(line)
    assert record["msg"] == "instance created"
    assert record["level"] == "info"
    assert record["logger"] == "egressd.test"
    assert record["proxy"] == "ns/a"
    assert record["instance"] == "px-1"
    assert record["ts"].endswith("Z")


def test_text_appends_fields_as_key_value() -> None:
    (line,) = emit("text").splitlines()
    assert "INFO" in line
    assert line.endswith("egressd.test: instance created proxy=ns/a instance=px-1")
