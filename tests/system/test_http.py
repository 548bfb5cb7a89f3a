"""The scrape endpoint's HTTP, spoken over raw sockets: keep-alive, HTTP/1.0, Connection: close,
HEAD, wrong methods and paths, garbage, oversized headers, idle connections, a body that changes."""

import select
import socket
import threading
import time

import pytest
from helpers import wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.prometheus import http
from nodecheck.prometheus.http import ScrapeServer, listening_socket, parse_request


def start_server(bodies: list, auth=None) -> tuple[int, ScrapeServer]:
    sock = listening_socket("127.0.0.1", 0)
    scrape = ScrapeServer(sock, lambda: bodies[-1], "text/plain; version=0.0.4", auth=auth)
    scrape.start()
    return sock.getsockname()[1], scrape


@pytest.fixture
def running():
    """(port, bodies, the ScrapeServer): append to bodies to publish a new one."""
    bodies = [b"metric_a 1\n"]
    port, scrape = start_server(bodies)
    yield port, bodies, scrape
    scrape.stop()


@pytest.fixture
def server(running):
    return running[:2]


class Client:
    """A raw connection that reads replies one at a time, keeping bytes that arrive early (a second
    pipelined reply often comes in the same recv as the first)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.pending = b""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, what: str) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before {what}: {self.pending!r}")
        self.pending += chunk

    def reply(self, head_only: bool = False) -> tuple[str, dict, bytes]:
        """One response: status line, headers, the body of Content-Length bytes (none for HEAD)."""
        while b"\r\n\r\n" not in self.pending:
            self._fill("a full reply")
        head, _, self.pending = self.pending.partition(b"\r\n\r\n")
        status, *lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = 0 if head_only else int(headers.get("content-length", 0))
        while len(self.pending) < length:
            self._fill("the end of the body")
        body, self.pending = self.pending[:length], self.pending[length:]
        return status, headers, body

    def closed_by_server(self, wait: float = 2) -> bool:
        """True when the server closes the connection within `wait` seconds (with nothing left unread)."""
        if self.pending:
            return False
        self.sock.settimeout(wait)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def test_keep_alive_serves_the_latest_body_on_one_connection(server):
    port, bodies = server
    with Client(port) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = conn.reply()
        assert status == "HTTP/1.1 200 OK" and body == b"metric_a 1\n"
        assert headers["content-type"] == "text/plain; version=0.0.4" and "connection" not in headers
        bodies.append(b"metric_a 2\n")  # a new report was rendered
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n")  # pipelined
        assert conn.reply()[2] == b"metric_a 2\n" and conn.reply()[2] == b"metric_a 2\n"


@pytest.mark.parametrize("request_bytes", [
    b"GET /metrics HTTP/1.0\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
])
def test_http10_and_connection_close_end_the_connection(server, request_bytes):
    port, _ = server
    with Client(port) as conn:
        conn.sendall(request_bytes)
        status, headers, body = conn.reply()
        assert status.endswith("200 OK") and headers["connection"] == "close" and body
        assert conn.closed_by_server()


def test_head_has_headers_and_no_body(server):
    port, _ = server
    with Client(port) as conn:
        conn.sendall(b"HEAD /metrics HTTP/1.1\r\n\r\n")
        status, headers, body = conn.reply(head_only=True)
        assert status == "HTTP/1.1 200 OK" and headers["content-length"] == "11" and body == b""
        conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # nothing was sent after the head: the next reply follows it
        assert conn.reply()[2] == b"metric_a 1\n"


@pytest.mark.parametrize("request_bytes,status,closes", [
    (b"GET /other HTTP/1.1\r\n\r\n", "404 Not Found", False),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", "405 Method Not Allowed", True),
    (b"\x16\x03\x01 TLS to a plain port\r\n\r\n", "400 Bad Request", True),
    (b"GET /metrics\r\n\r\n", "400 Bad Request", True),
    (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", "400 Bad Request", True),
    (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (http.MAX_HEAD_BYTES + 10), "431 Request Header Fields Too Large", True),
])
def test_bad_requests_get_a_clear_status(server, request_bytes, status, closes):
    port, _ = server
    with Client(port) as conn:
        conn.sendall(request_bytes)
        got, _, body = conn.reply()
        assert got == f"HTTP/1.1 {status}" and body
        assert conn.closed_by_server() == closes
    with Client(port) as conn:  # and the server goes on serving
        conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert conn.reply()[0].endswith("200 OK")


def test_idle_connection_is_closed(server, monkeypatch):
    monkeypatch.setattr(http, "IDLE_TIMEOUT_S", 0.2)
    port, _ = server
    with Client(port) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        conn.reply()
        assert conn.closed_by_server()


def test_port_taken_is_an_error_in_the_callers_thread():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(OSError):
            listening_socket("127.0.0.1", holder.getsockname()[1])


def test_parse_request_reads_method_path_version_and_headers():
    request = parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a:1\r\nAuthorization: Basic eDp5\r\n\r\n")
    assert (request.method, request.path, request.version) == ("GET", "/metrics?x=1", "HTTP/1.1")
    assert request.headers == {"host": "a:1", "authorization": "Basic eDp5"} and request.keep_alive
    assert not parse_request(b"GET / HTTP/1.0\r\n\r\n").keep_alive
    assert parse_request(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive
    assert parse_request(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n").has_body
    for garbage in (b"", b"GET / HTTP/2\r\n\r\n", b"G3T / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\n : x\r\n\r\n"):
        assert parse_request(garbage) is None, garbage


@settings(max_examples=300, deadline=None)
@given(head=st.binary(max_size=300))
def test_parse_request_never_raises(head):
    parse_request(head + b"\r\n\r\n")


def test_http10_keep_alive_is_answered_and_honoured(server):
    port, _ = server
    with Client(port) as conn:
        conn.sendall(b"GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, body = conn.reply()
        assert status.endswith("200 OK") and headers["connection"] == "keep-alive" and body == b"metric_a 1\n"
        conn.sendall(b"GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")  # the same connection
        assert conn.reply()[2] == b"metric_a 1\n"


def test_no_report_yet_is_503_never_an_empty_body():
    bodies = [None]
    port, scrape = start_server(bodies)
    try:
        with Client(port) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            status, headers, body = conn.reply()
            assert status == "HTTP/1.1 503 Service Unavailable" and headers["retry-after"] and b"first probe round" in body
            bodies.append(b"metric_a 1\n")  # the first Report lands
            conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            assert conn.reply()[:3:2] == ("HTTP/1.1 200 OK", b"metric_a 1\n")
    finally:
        scrape.stop()


def test_connections_past_the_cap_close_the_oldest_idle_one(running):
    port, _, scrape = running
    scrape.max_connections = 4
    idle = [Client(port) for _ in range(4)]
    try:
        for conn in idle:  # each has been answered once and now waits, idle
            conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            conn.reply()
        with Client(port) as newcomer:
            newcomer.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            assert newcomer.reply()[0].endswith("200 OK")
            assert idle[0].closed_by_server() and not idle[1].closed_by_server(0.2)
            assert len(scrape._connections) <= 4
    finally:
        for conn in idle:
            conn.sock.close()


def pipeline_until_dropped(hog: Client, scrape: ScrapeServer) -> None:
    """A client with a tiny receive buffer pipelines requests for a large body and never reads: the server
    answers into a full buffer until its send timeout drops the connection."""
    hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.sock.settimeout(2)
    try:
        hog.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" * 64)  # pipelined, never read
    except OSError:
        pass  # the server may have closed it already
    wait_until(lambda: len(scrape._connections) == 1, 10, "the connection to be accepted")
    wait_until(lambda: not scrape._connections, 10, "the server to drop the connection")


def test_a_client_that_never_reads_is_closed(monkeypatch):
    monkeypatch.setattr(http, "SEND_TIMEOUT_S", 0.5)
    bodies = [b"x" * (1 << 20)]
    port, scrape = start_server(bodies)
    try:
        with Client(port) as hog:
            pipeline_until_dropped(hog, scrape)
            with Client(port) as other:
                other.sendall(b"HEAD /metrics HTTP/1.1\r\n\r\n")
                assert other.reply(head_only=True)[0].endswith("200 OK")
    finally:
        scrape.stop()


def test_asyncio_accept_errors_are_logged_once_per_interval():
    import logging

    records = [logging.LogRecord("asyncio", logging.ERROR, "x", 1, "socket.accept() out of system resource", None, None)
               for _ in range(1000)]
    gate = http.OncePerInterval(60)
    assert sum(gate.filter(record) for record in records) == 1
    assert gate.filter(logging.LogRecord("asyncio", logging.ERROR, "x", 1, "another message", None, None))
    assert http._ASYNCIO_LOG_FILTER in logging.getLogger("asyncio").filters


def basic(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_unknown_users_cost_the_same_bcrypt_work_as_known_ones(monkeypatch):
    bcrypt = pytest.importorskip("bcrypt")
    from nodecheck.prometheus.webconfig import BasicAuth

    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})
    checked = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, hashed: checked.append(hashed[:7]) or real(password, hashed))
    assert auth.remembered(basic("nobody", "x")) is None  # not answered early: only bcrypt tells
    assert not auth.allows(basic("nobody", "x")) and not auth.allows(basic("prometheus", "wrong"))
    assert checked == [b"$2b$04$", b"$2b$04$"]  # one check each, at the configured cost
    assert auth.allows(basic("prometheus", "s3cret")) and auth.remembered(basic("prometheus", "s3cret"))
    assert auth.remembered("Basic !!!") is False


def test_a_flood_of_passwords_queues_bounded_bcrypt_work(monkeypatch):
    bcrypt = pytest.importorskip("bcrypt")
    from nodecheck.prometheus.webconfig import BasicAuth

    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})
    release, started = threading.Event(), []
    monkeypatch.setattr(auth, "allows", lambda header: started.append(1) or release.wait(30) and False)
    port, scrape = start_server([b"metric_a 1\n"], auth=auth)
    clients = [Client(port) for _ in range(http.MAX_PENDING_AUTH + 6)]
    try:
        for conn in clients:
            conn.sendall(f"GET /metrics HTTP/1.1\r\nAuthorization: {basic('prometheus', 'guess')}\r\n\r\n".encode())
        # whichever requests the server took first fill the queue; every other one is answered at once
        expected = len(clients) - http.MAX_PENDING_AUTH
        answered, deadline = {}, time.monotonic() + 20
        while len(answered) < expected and time.monotonic() < deadline:
            readable, _, _ = select.select([c.sock for c in clients if c not in answered], [], [], 1)
            for conn in clients:
                if conn.sock in readable:
                    answered[conn] = conn.reply()[0]
        assert list(answered.values()) == ["HTTP/1.1 429 Too Many Requests"] * expected
        assert scrape._auth_pending == http.MAX_PENDING_AUTH and len(started) <= 2  # queued, two at work
    finally:
        release.set()
        for conn in clients:
            conn.sock.close()
        scrape.stop()


def test_a_dropped_slow_reader_gives_its_descriptor_back(monkeypatch):
    """Issue 21 (3): after the send timeout the server closed the connection with its reply unsent, and
    close() waits for a reader that never reads: the socket and its descriptor stayed while the connection
    had already left the cap's count. The server now aborts it: its descriptor is back."""
    import os

    monkeypatch.setattr(http, "SEND_TIMEOUT_S", 0.5)
    port, scrape = start_server([b"x" * (1 << 20)])

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    try:
        before = descriptors()
        with Client(port) as hog:
            pipeline_until_dropped(hog, scrape)
            wait_until(lambda: descriptors() == before + 1, 10, "the server's socket to be gone (the hog's own remains)")
    finally:
        scrape.stop()


def test_clients_stuck_in_their_tls_handshake_count_against_the_cap(tmp_path):
    """TLS handshakes ran before a connection was counted: 1,100 silent clients at nofile 1,024 took every
    descriptor and a real scraper got 4 answers in 40 s. A handshake is inside the cap now; past it the oldest
    silent one is shed, and every scraper is answered."""
    import ssl

    from helpers import make_ca_and_certs

    make_ca_and_certs(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    sock = listening_socket("127.0.0.1", 0)
    scrape = ScrapeServer(sock, lambda: b"metric_a 1\n", "text/plain; version=0.0.4", tls=server_tls)
    scrape.max_connections = 4
    scrape.start()
    port = sock.getsockname()[1]
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]  # never say hello
    try:
        wait_until(lambda: list(scrape._connections.values()) == [http.HANDSHAKE] * 4, 10, "the silent clients counted")
        client_tls = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                    client_tls.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                conn.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
                answer = b""
                while chunk := conn.recv(65536):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"metric_a 1\n")
            assert len(scrape._connections) <= 4
    finally:
        for conn in silent:
            conn.close()
        scrape.stop()


def test_slow_readers_are_shed_so_a_new_scraper_finds_room(monkeypatch):
    """Slow readers (a reply written, never read) filled the cap and new scrapers were refused (cap 64: 257 ok,
    3,777 failed). Past the cap the oldest slow reader is shed for the newcomer."""
    monkeypatch.setattr(http, "SEND_TIMEOUT_S", 60)  # the hogs stay until shed, not timed out
    port, scrape = start_server([b"x" * (4 << 20)])
    scrape.max_connections = 4
    hogs = [Client(port) for _ in range(4)]
    try:
        for hog in hogs:
            hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            hog.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # megabytes into a 4 KiB window, never read
        wait_until(lambda: list(scrape._connections.values()).count(http.SENDING) == 4, 10, "four slow readers")
        for _ in range(3):
            with Client(port) as newcomer:
                newcomer.sendall(b"HEAD /metrics HTTP/1.1\r\n\r\n")
                assert newcomer.reply(head_only=True)[0].endswith("200 OK")
        assert len(scrape._connections) <= 4

        def ends_short(hog: Client) -> bool:  # shed: the connection ends before the whole reply came
            got, deadline = 0, time.monotonic() + 10
            try:
                while time.monotonic() < deadline and (chunk := hog.sock.recv(1 << 16)):
                    got += len(chunk)
            except (ConnectionResetError, TimeoutError):
                pass
            return got < 4 << 20

        assert ends_short(hogs[0])
    finally:
        for hog in hogs:
            hog.sock.close()
        scrape.stop()
