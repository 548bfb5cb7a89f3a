"""`nodecheck serve`: the Report as a Prometheus scrape target.

A refresher thread rebuilds the Report every interval (the probes run with their own deadlines),
renders its exposition once (the custom collector builds fresh families from that Report) and swaps
both in. A scrape (src/nodecheck/prometheus/http.py) only copies the latest rendered bytes: it never waits for a probe, a
probe that raises or hangs never fails a scrape, and 50 concurrent scrapers cost no re-rendering
(rendering an 8-GPU Report takes ~4 ms of Python). The daemon never imports torch.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST

from nodecheck.config import DEFAULT_VIRTUAL_NICS
from nodecheck.core.errors import NodecheckError
from nodecheck.host.commands import kill_running_commands
from nodecheck.prometheus.exposition import exposition
from nodecheck.prometheus.http import ScrapeServer, listening_socket
from nodecheck.report.model import Measurement, Report
from nodecheck.verdicts.signal_join import held_gpus

log = logging.getLogger("nodecheck.serve")


class LatestReport:
    """The most recent Report, with the latest bandwidth results merged in, rendered; scrapes read the
    bytes. The refresher and the bench thread both publish: one at a time, each from the other's latest."""

    def __init__(self, config=None, on_report: Callable[[Report], None] | None = None) -> None:
        self._on_report = on_report  # told each judged Report (serve --kubernetes-conditions); must not block
        self._lock = threading.Lock()  # guards _body, held only to swap or copy it
        self._publishing = threading.Lock()  # serialises publishers (probe rounds, bench runs)
        self._config = config
        self._probed: Report | None = None
        self._measured: tuple[list[Measurement], float] | None = None
        self._body: bytes | None = None  # until the first Report: scrapes get 503, never a Report-less body

    def body(self) -> bytes | None:
        with self._lock:
            return self._body

    def set(self, report: Report) -> None:
        with self._publishing:
            self._probed = report
            self._publish()

    def probed(self) -> Report | None:
        """The latest probe round's Report (no measurements), None before the first."""
        return self._probed

    def set_measurements(self, measurements: list[Measurement], measured_at: float) -> None:
        with self._publishing:
            self._measured = (measurements, measured_at)
            self._publish()

    def _publish(self) -> None:
        from nodecheck.verdicts.bandwidth import with_measurements

        report = self._probed
        if report is not None and self._measured is not None:
            measurements, measured_at = self._measured
            report = with_measurements(report, measurements, measured_at, self._config)
        virtual_nics = self._config.virtual_nics if self._config else DEFAULT_VIRTUAL_NICS
        body = exposition(report, virtual_nics)  # outside _lock: scrapes keep getting the previous bytes meanwhile
        with self._lock:
            self._body = body
        if report is not None and self._on_report is not None:
            self._on_report(report)


class RoundLog:
    """What the daemon says about its probe rounds: a probe that starts failing (warning), one that keeps
    failing (again at most every `repeat` seconds, with how many rounds), one that recovers (info); a
    one-line summary of every round at debug level. A probe that has no data (no GPU driver on a CPU node)
    is no failure and says nothing."""

    def __init__(self, repeat: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.repeat, self.clock = repeat, clock
        self.rounds = 0
        self.failing: dict[str, tuple[int, float]] = {}  # probe -> (rounds failed in a row, when last said)

    def round(self, report: Report, seconds: float) -> None:
        self.rounds += 1
        now = self.clock()
        for probe in report.probes:
            failed = not probe.ok and not probe.no_data
            if failed and probe.name not in self.failing:
                log.warning("probe %s failed: %s", probe.name, probe.error)
                self.failing[probe.name] = (1, now)
            elif failed:
                count, said = self.failing[probe.name]
                if now - said >= self.repeat:
                    log.warning("probe %s still failing (%d rounds in a row): %s", probe.name, count + 1, probe.error)
                    said = now
                self.failing[probe.name] = (count + 1, said)
            elif probe.name in self.failing:
                log.info("probe %s recovered after %d failed round(s)", probe.name, self.failing.pop(probe.name)[0])
        states = [("ok" if p.ok else "no data" if p.no_data else "failed") for p in report.probes]
        severities = {s: sum(1 for f in report.findings if f.severity == s) for s in ("critical", "error", "warning", "info")}
        log.debug("round %d in %.2f s: probes %d ok, %d no data, %d failed; findings %s", self.rounds, seconds,
                  states.count("ok"), states.count("no data"), states.count("failed"),
                  ", ".join(f"{n} {s}" for s, n in severities.items() if n) or "none")


def refresh_forever(latest: LatestReport, build: Callable[[], Report], interval: float, stop: threading.Event,
                    rounds: RoundLog | None = None) -> None:
    rounds = rounds or RoundLog()
    while not stop.is_set():
        started = time.monotonic()
        try:
            report = build()
            rounds.round(report, time.monotonic() - started)  # said before published: a scrape never sees a round unlogged
            latest.set(report)
        except Exception:  # keep serving the last good Report; the next round tries again
            log.exception("building the report failed; serving the previous one")
        stop.wait(interval)


BUSY_PERCENT = 10  # a GPU busier than this runs someone's work


def busy_gpus(report: Report | None) -> list[str]:
    """The GPUs the latest probe round found at work ("gpu3 at 97%") or held by another process ("gpu3 held by pid
    4242 python3"): a bench beside a job measures the job (a slow verdict, and with --kubernetes-taint a taint) and
    slows it."""
    held = held_gpus(report) if report else {}  # a job loading its data holds the GPU at 0%
    busy = []
    for g in report.gpus if report else []:
        if (g.utilization_percent or 0) > BUSY_PERCENT:
            busy.append(f"gpu{g.index} at {g.utilization_percent}%")
        elif f"gpu{g.index}" in held:
            busy.append(f"gpu{g.index} held by {held[f'gpu{g.index}']}")
    return busy


def bench_forever(latest: LatestReport, bench: Callable[[], list[Measurement]], every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        probed = latest.probed()
        if probed is None:
            continue  # no facts yet: whether the GPUs are busy is unknown
        busy = busy_gpus(probed)
        if busy:
            log.info("bench round skipped: %s busy (a bench beside their work would measure it); the last figures stay",
                     ", ".join(busy))
            continue
        measurements = bench()
        failed = [m for m in measurements if not m.ok]
        for m in failed:
            log.warning("bench %s on %s failed: %s", m.test, m.path, m.error)
        log.info("bench run: %d measurement(s), %d failed", len(measurements), len(failed))
        latest.set_measurements(measurements, time.time())


def follow_measurements(latest: LatestReport, read: Callable[[], tuple[list[Measurement], float | None]], every: float,
                        stop: threading.Event) -> None:
    """Publish the measurements a file holds (`serve --measurements FILE`, written by a bench timer), read now
    and again every `every` seconds; a file that cannot be read keeps what was published, and is logged."""
    while True:
        try:
            measurements, measured_at = read()
            latest.set_measurements(measurements, measured_at or time.time())
        except NodecheckError as error:
            log.warning("measurements not read: %s", error)
        if stop.wait(every):
            return


def _appended(body: bytes | None, more: bytes) -> bytes | None:
    return None if body is None else body + more  # no Report yet: still 503, whatever else is known


def _tls_context(certfile: str, keyfile: str, client_cafile: str | None) -> ssl.SSLContext:
    """The standard library's TLS, configured as prometheus_client's start_http_server configures it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except (ssl.SSLError, OSError) as error:  # OpenSSL's "[SSL] PEM lib" names no file: say which pair
        raise NodecheckError(f"the TLS certificate {certfile} or its key {keyfile}: not a certificate and its "
                             f"private key in PEM ({getattr(error, 'strerror', None) or error})") from None
    if client_cafile:
        try:
            context.load_verify_locations(cafile=client_cafile)
        except (ssl.SSLError, OSError) as error:
            raise NodecheckError(f"the client CA file {client_cafile}: not PEM certificates "
                                 f"({getattr(error, 'strerror', None) or error})") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serve(host: str, port: int, build: Callable[[], Report], interval: float, stop: threading.Event,
          web=None, bench: Callable[[], list[Measurement]] | None = None, bench_every: float = 0,
          config=None, measurements: Callable[[], tuple[list[Measurement], float | None]] | None = None,
          node_health=None) -> None:
    """web: a webconfig.WebConfig (TLS, mutual TLS, basic auth). bench: run every bench_every seconds
    (0: never, the default on nodes that run jobs). node_health: a node_health.NodeHealth that publishes each
    judged Report as the node's conditions."""
    from nodecheck.prometheus.webconfig import BasicAuth

    latest = LatestReport(config, node_health.offer if node_health is not None else None)
    tls = web.tls if web else {}
    auth = BasicAuth(web.users) if web and web.users else None
    context = _tls_context(tls["certfile"], tls["keyfile"], tls.get("client_cafile")) if tls else None
    body = latest.body if node_health is None else lambda: _appended(latest.body(), node_health.exposition())
    server = ScrapeServer(listening_socket(host, port), body, CONTENT_TYPE_LATEST, context, auth)
    threading.Thread(target=refresh_forever, args=(latest, build, interval, stop), name="refresh", daemon=True).start()
    server.start()
    if bench is not None and bench_every > 0:
        threading.Thread(target=bench_forever, args=(latest, bench, bench_every, stop), name="bench", daemon=True).start()
    if measurements is not None:
        threading.Thread(target=follow_measurements, args=(latest, measurements, interval, stop), name="measurements",
                         daemon=True).start()
    if node_health is not None:
        threading.Thread(target=node_health.follow, args=(stop,), name="node-health", daemon=True).start()
    log.info("serving /metrics on %s:%d%s%s", host, port, " (TLS)" if tls else "", " (basic auth)" if auth else "")
    try:
        # Polled, not stop.wait(): `nodecheck serve` sets `stop` from its SIGTERM handler, which runs in this
        # thread; had the signal landed while this thread held the Event's lock inside wait(), the handler's
        # set() would have waited on that lock forever (a serve that ignored SIGTERM, seen once under load).
        while not stop.is_set():
            time.sleep(0.2)
    finally:
        server.stop()
        kill_running_commands()  # a probe command still hung (nvidia-smi) ends with the daemon
