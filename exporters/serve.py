"""`nodecheck serve`: the Report as a Prometheus scrape target.

A refresher thread rebuilds the Report every interval (the probes run with their own deadlines),
renders its exposition once (the custom collector builds fresh families from that Report) and swaps
both in. A scrape only copies the latest rendered bytes: it never waits for a probe, a probe that
raises or hangs never fails a scrape, and 50 concurrent scrapers cost no re-rendering (rendering an
8-GPU Report takes ~4 ms of Python; benchmarks/bench_exporter.py). The daemon never imports torch.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.exposition import ThreadingWSGIServer

from nodecheck.exporters.prometheus import ReportCollector
from nodecheck.model import Report

log = logging.getLogger("nodecheck.serve")


def render(report: Report | None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(lambda: report))
    return generate_latest(registry)


class LatestReport:
    """The most recent Report and its rendered metrics, replaced together (never half-built)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report: Report | None = None
        self._body = render(None)

    def get(self) -> Report | None:
        with self._lock:
            return self._report

    def body(self) -> bytes:
        with self._lock:
            return self._body

    def set(self, report: Report) -> None:
        body = render(report)  # outside the lock: scrapes keep getting the previous bytes meanwhile
        with self._lock:
            self._report, self._body = report, body


def refresh_forever(latest: LatestReport, build: Callable[[], Report], interval: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            latest.set(build())
        except Exception:  # keep serving the last good Report; the next round tries again
            log.exception("building the report failed; serving the previous one")
        stop.wait(interval)


def metrics_app(latest: LatestReport):
    def app(environ, start_response):
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"nodecheck serves /metrics\n"]
        body = latest.body()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
        return [body]
    return app


class _Server(ThreadingWSGIServer):
    # socketserver's default listen backlog is 5: with 200 concurrent scrapers (tests/test_serve.py) the
    # kernel drops SYNs and clients wait out retransmits past their timeout. The kernel caps it (somaxconn).
    request_queue_size = 1024


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # one line per scrape is noise in the journal
        pass


def _tls_context(certfile: str, keyfile: str, client_cafile: str | None) -> ssl.SSLContext:
    """The standard library's TLS, configured as prometheus_client's start_http_server configures it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if client_cafile:
        context.load_verify_locations(cafile=client_cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serve(host: str, port: int, build: Callable[[], Report], interval: float, stop: threading.Event,
          tls: dict | None = None) -> None:
    """tls: certfile, keyfile and optionally client_cafile (mutual TLS)."""
    latest = LatestReport()
    server_class = type("Server", (_Server,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    server = make_server(host, port, metrics_app(latest), server_class, handler_class=_QuietHandler)
    if tls:
        server.socket = _tls_context(tls["certfile"], tls["keyfile"], tls.get("client_cafile")).wrap_socket(
            server.socket, server_side=True)
    threading.Thread(target=refresh_forever, args=(latest, build, interval, stop), name="refresh", daemon=True).start()
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info("serving /metrics on %s:%d%s", host, port, " (TLS)" if tls else "")
    try:
        while not stop.wait(3600):
            pass
    finally:
        server.shutdown()
