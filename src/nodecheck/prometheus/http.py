"""The scrape endpoint: GET /metrics answered from bytes rendered in advance, on one asyncio event loop.

Why not http.server: with a thread per connection, 50 kept-alive scrapers contend for the GIL, which
a running thread keeps for up to 5 ms (sys.getswitchinterval), and /metrics p99 was 28 ms on this
2-core machine; one event loop answers the same load with p99 under 5 ms
(benchmarks/bench_exporter.py). The HTTP handled here is the little a scraper speaks: a request line
and headers, no request body, keep-alive unless HTTP/1.0 or `Connection: close`. TLS is the standard
library's, through asyncio.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("nodecheck.serve")

IDLE_TIMEOUT_S = 60  # a kept-alive connection that sends nothing for this long is closed
SEND_TIMEOUT_S = 10  # a client that does not read its reply for this long is closed
TLS_HANDSHAKE_TIMEOUT_S = 10
MAX_HEAD_BYTES = 16 * 1024  # request line and headers; Prometheus sends a few hundred bytes
# Open connections at most: well below the descriptors a process gets (systemd's default soft limit is
# 1024), so idle clients can never starve a scrape of a descriptor. Past it the oldest idle one goes.
MAX_CONNECTIONS = 512
MAX_PENDING_AUTH = 8  # bcrypt checks queued at most; a flood of wrong passwords gets 429 past it
HANDSHAKE, IDLE, BUSY, SENDING = "handshake", "idle", "busy", "sending"  # a connection's state
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            429: "Too Many Requests", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class OncePerInterval(logging.Filter):
    """Lets a message through once per `interval` seconds. asyncio logs a traceback for every failed
    accept (out of descriptors), retrying each second per listener: megabytes of log in a minute."""

    def __init__(self, interval: float = 60.0) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:80]
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -self.interval) < self.interval:
                return False
            self._last[key] = now
        return True


_ASYNCIO_LOG_FILTER = OncePerInterval()
logging.getLogger("asyncio").addFilter(_ASYNCIO_LOG_FILTER)


@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"

    @property
    def has_body(self) -> bool:
        return self.headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in self.headers


def parse_request(head: bytes) -> Request | None:
    """The request line and headers (up to the blank line), or None when they are not HTTP/1.x."""
    lines = head.decode("latin-1").split("\r\n")  # latin-1 maps every byte: no decode error
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not parts[0].isalpha():
        return None
    request = Request(parts[0], parts[1], parts[2])
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        request.headers[name.lower()] = value.strip()
    return request


def response(code: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
             headers: tuple[tuple[str, str], ...] = (), keep_alive: bool = True, http10: bool = False) -> bytes:
    """Status line, headers and body as one buffer: one write, so no Nagle wait between two.
    http10: the client spoke HTTP/1.0, which closes unless told `Connection: keep-alive`."""
    lines = [f"HTTP/1.1 {code} {_REASONS[code]}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}",
             *(f"{name}: {value}" for name, value in headers)]
    if not keep_alive:
        lines.append("Connection: close")
    elif http10:
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ScrapeServer:
    """Serves `body()` (the latest rendered exposition, with its content type; None before the first
    Report, answered 503) on a listening socket, from an event loop in its own thread.
    auth: a webconfig.BasicAuth or None."""

    def __init__(self, sock: socket.socket, body: Callable[[], bytes | None], content_type: str,
                 tls: ssl.SSLContext | None = None, auth=None) -> None:
        self._sock, self._body, self._content_type, self._tls, self._auth = sock, body, content_type, tls, auth
        self._cached_body: bytes | None = None  # only touched from the loop's thread
        self._cached: dict[tuple[bool, bool], bytes] = {}
        # open connections, oldest first, each in its state: HANDSHAKE (TLS), IDLE (awaiting a request), BUSY (being
        # answered) or SENDING (its reply written, the client not yet reading it); and each one's task
        self._connections: dict[asyncio.StreamWriter, str] = {}
        self._tasks: dict[asyncio.StreamWriter, asyncio.Task] = {}
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.max_connections = max(8, min(MAX_CONNECTIONS, soft_limit // 2 if soft_limit > 0 else MAX_CONNECTIONS))
        self._auth_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bcrypt") if auth else None
        self._auth_pending = 0
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()  # set from stop(), through the loop
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(5)
        if self._auth_pool is not None:
            self._auth_pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        # TLS starts inside each connection, after it is counted: a client that never finishes its handshake holds a
        # descriptor like any other (1,100 silent clients at nofile 1,024 took every one, outside the cap)
        loop = asyncio.get_running_loop()
        paused = self._tls is not None
        server = await loop.create_server(
            lambda: _Unread(asyncio.StreamReader(limit=MAX_HEAD_BYTES), self._connection, paused), sock=self._sock)
        async with server:
            await self._stopping.wait()
        # connections still open (kept alive, mid-reply) end with the server
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Make room for a new connection: past the cap the oldest connection that is idle or still in its TLS
        handshake is ended, else the oldest slow reader (its reply unread): a new scraper always finds room. Only
        when every connection is being answered is the new one refused (closed unanswered)."""
        if len(self._connections) >= self.max_connections:
            shed = next((w for w, state in self._connections.items() if state in (IDLE, HANDSHAKE)), None)
            shed = shed or next((w for w, state in self._connections.items() if state == SENDING), None)
            if shed is None:
                return False
            self._connections.pop(shed)
            self._tasks.pop(shed).cancel()  # its task ends it: asyncio's TLS set-up cleans up after itself
        self._connections[writer] = HANDSHAKE if self._tls else IDLE
        self._tasks[writer] = asyncio.current_task()
        return True

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write and wait until the client has taken it, at most SEND_TIMEOUT_S: a client that pipelines
        requests and never reads cannot hold a connection (and its buffers) forever."""
        writer.write(data)
        if writer in self._connections:
            self._connections[writer] = SENDING
        await asyncio.wait_for(writer.drain(), SEND_TIMEOUT_S)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        if not self._admit(writer):
            writer.close()
            return
        try:
            # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; ours were accepted
            # from a socket created with proto 0, so it is set here
            sock = writer.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:  # the ClientHello is still unread (_Unread): TLS reads it from the start
                await asyncio.wait_for(writer.start_tls(self._tls), TLS_HANDSHAKE_TIMEOUT_S)
            while True:
                # a timer that closes an idle connection: half the cost of asyncio.wait_for per request
                idle = loop.call_later(IDLE_TIMEOUT_S, writer.close)
                self._connections[writer] = IDLE
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    await self._send(writer, response(431, b"request headers too large\n", keep_alive=False))
                    break
                finally:
                    idle.cancel()
                if writer not in self._connections:
                    break  # closed to make room while it waited
                self._connections[writer] = BUSY
                request = parse_request(head)
                if request is None:
                    await self._send(writer, response(400, b"not an HTTP/1.x request\n", keep_alive=False))
                    break
                reply, keep = await self._answer(request)
                await self._send(writer, reply)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ssl.SSLError, OSError):
            pass  # the client went away, idled out, did not read, or spoke garbage TLS: nothing to answer
        except asyncio.CancelledError:
            pass  # shed to make room, or the server stopping: the connection ends here
        finally:
            self._connections.pop(writer, None)
            if self._tasks.get(writer) is asyncio.current_task():
                del self._tasks[writer]
            _end(writer)

    async def _answer(self, request: Request) -> tuple[bytes, bool]:
        keep = request.keep_alive and not request.has_body  # a body we do not read would be taken for the next request
        http10 = request.version == "HTTP/1.0"
        if request.method not in ("GET", "HEAD"):
            return response(405, b"nodecheck serves GET /metrics\n", headers=(("Allow", "GET, HEAD"),), keep_alive=False), False
        if self._auth is not None:
            allowed = await self._allowed(request.headers.get("authorization"))
            if allowed is None:
                return response(429, b"too many authentication attempts in flight; retry\n",
                                headers=(("Retry-After", "1"),), keep_alive=False), False
            if not allowed:
                return response(401, b"Unauthorized\n", headers=(("WWW-Authenticate", 'Basic realm="nodecheck"'),),
                                keep_alive=keep, http10=http10), keep
        if request.path.split("?", 1)[0] not in ("/", "/metrics"):
            return response(404, b"nodecheck serves /metrics\n", keep_alive=keep, http10=http10), keep
        reply = self._metrics_reply(keep, http10)
        if request.method == "HEAD":
            reply = reply[: reply.index(b"\r\n\r\n") + 4]
        return reply, keep

    def _metrics_reply(self, keep_alive: bool, http10: bool) -> bytes:
        """The 200 reply, built once per rendered body (the body changes once per probe round); 503
        before the first Report, so no scrape ever sees a body without one."""
        body = self._body()
        if body is None:
            return response(503, b"nodecheck: the first probe round has not finished yet\n",
                            headers=(("Retry-After", "5"),), keep_alive=keep_alive, http10=http10)
        if self._cached_body is not body:
            self._cached = {}
            self._cached_body = body
        key = (keep_alive, http10)
        if key not in self._cached:
            self._cached[key] = response(200, body, self._content_type, keep_alive=keep_alive, http10=http10)
        return self._cached[key]

    async def _allowed(self, header: str | None) -> bool | None:
        """Whether the credentials pass; None when too many bcrypt checks are already queued."""
        known = self._auth.remembered(header)
        if known is not None:
            return known
        if self._auth_pending >= MAX_PENDING_AUTH:
            return None
        # bcrypt takes tens of milliseconds on purpose: off the loop, on a pool of its own so that a
        # flood of wrong passwords queues at most MAX_PENDING_AUTH checks
        self._auth_pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._auth_pool, self._auth.allows, header)
        finally:
            self._auth_pending -= 1


class _Unread(asyncio.StreamReaderProtocol):
    """A stream whose first bytes stay unread until TLS starts: asyncio's start_tls on the server side cannot see
    a ClientHello the stream has already buffered, and a client speaks first (the handshake then stalled)."""

    def __init__(self, reader: asyncio.StreamReader, connected, paused: bool) -> None:
        super().__init__(reader, connected)
        self._hold_first_bytes = paused  # (not _paused: FlowControlMixin keeps its write pause there)

    def connection_made(self, transport) -> None:
        if self._hold_first_bytes:
            transport.pause_reading()  # start_tls resumes it under the TLS protocol
        super().connection_made(transport)


def _end(writer: asyncio.StreamWriter) -> None:
    """Close a connection now. With a reply still unsent (a client that stopped reading), close() waits for it
    to be taken, which never happens: the socket, its buffers (up to 4 MB of kernel memory) and its descriptor
    stayed after the connection had left the cap's count (1,100 such clients took the server to 1,024 of 1,024
    descriptors). abort() drops the unsent data and resets the connection."""
    transport = writer.transport
    if transport is None:  # a TLS set-up that failed took it down already
        return
    if transport.get_write_buffer_size() > 0:  # closing or not: close() alone would wait on a reader that never reads
        transport.abort()
    else:
        writer.close()


def listening_socket(host: str, port: int) -> socket.socket:
    """Bound here, in the caller's thread, so a port already taken is the caller's clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)
