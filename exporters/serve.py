"""`nodecheck serve`: the Report as a Prometheus scrape target.

A refresher thread rebuilds the Report every interval (the probes run with their own deadlines) and
swaps it in; a scrape only reads the latest Report, so it never waits for a probe, and a probe that
raises or hangs never fails a scrape. The daemon never imports torch.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

from nodecheck.exporters.prometheus import ReportCollector
from nodecheck.model import Report

log = logging.getLogger("nodecheck.serve")

# socketserver's default listen backlog is 5: with 200 concurrent scrapers (tests/test_serve.py) the
# kernel drops SYNs and clients wait out retransmits past their timeout. The kernel caps it (somaxconn).
ThreadingWSGIServer.request_queue_size = 1024


class LatestReport:
    """The most recent Report, replaced whole (readers never see a half-built one)."""

    def __init__(self) -> None:
        self._report: Report | None = None
        self._lock = threading.Lock()

    def get(self) -> Report | None:
        with self._lock:
            return self._report

    def set(self, report: Report) -> None:
        with self._lock:
            self._report = report


def refresh_forever(latest: LatestReport, build: Callable[[], Report], interval: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            latest.set(build())
        except Exception:  # keep serving the last good Report; the next round tries again
            log.exception("building the report failed; serving the previous one")
        stop.wait(interval)


def serve(host: str, port: int, build: Callable[[], Report], interval: float, stop: threading.Event,
          tls: dict | None = None) -> None:
    """tls: prometheus_client's own options (certfile, keyfile, client_cafile, client_auth_required)."""
    latest = LatestReport()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(latest.get))
    refresher = threading.Thread(target=refresh_forever, args=(latest, build, interval, stop), name="refresh", daemon=True)
    refresher.start()
    server, _ = start_http_server(port, addr=host, registry=registry, **(tls or {}))
    log.info("serving /metrics on %s:%d", host, port)
    try:
        while not stop.wait(3600):
            pass
    finally:
        server.shutdown()
