"""The engine's log lines reach Python's `logging` while they happen: with the S3 server
stopped mid-epoch, a handler on the `shardstream` logger receives the retry warnings during the
outage, before the one error that ends the epoch after the retry window."""

from __future__ import annotations

import logging
import os
import signal

import pytest

import shardstream
from conftest import MotoServer, write_ids


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_retry_warnings_reach_a_logging_handler_during_an_outage(tmp_path, monkeypatch, stream_env):
    server = MotoServer()
    handler = Records()
    logger = logging.getLogger("shardstream")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    shardstream.refresh_logging()
    try:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("SHARDSTREAM_RETRY_WINDOW", "3")
        local = tmp_path / "mds"
        write_ids(local, 200, size_limit=1 << 12, extra=100)
        remote = server.upload_dataset(local, f"logs-{tmp_path.name.lower().replace('_', '-')[-40:]}")
        ds = shardstream.StreamingDataset(remote=remote, batch_size=4)
        it = iter(ds)
        next(it)
        os.kill(server.proc.pid, signal.SIGSTOP)
        with pytest.raises(Exception):
            for _ in it:
                pass
        warnings = [r for r in handler.records if r.levelno >= logging.WARNING]
        assert warnings, [r.getMessage() for r in handler.records]
        assert all(r.name.startswith("shardstream.") for r in warnings), [r.name for r in warnings]
        assert any("retry" in r.getMessage() or "failed" in r.getMessage() for r in warnings), [
            r.getMessage() for r in warnings
        ]
        # Below the logger's level nothing is handed over: no debug records at WARNING.
        assert not [r for r in handler.records if r.levelno < logging.WARNING]
    finally:
        logger.removeHandler(handler)
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
