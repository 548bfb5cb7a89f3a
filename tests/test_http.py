"""The scrape endpoint's HTTP, spoken over raw sockets: keep-alive, HTTP/1.0, Connection: close,
HEAD, wrong methods and paths, garbage, oversized headers, idle connections, a body that changes."""

import socket

import pytest
from hypothesis import given, settings, strategies as st

from nodecheck.exporters import http
from nodecheck.exporters.http import ScrapeServer, listening_socket, parse_request


@pytest.fixture
def server():
    bodies = [b"metric_a 1\n"]
    sock = listening_socket("127.0.0.1", 0)
    scrape = ScrapeServer(sock, lambda: bodies[-1], "text/plain; version=0.0.4")
    scrape.start()
    yield sock.getsockname()[1], bodies
    scrape.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def read_reply(conn: socket.socket) -> tuple[str, dict, bytes]:
    """One response: status line, headers, the body of Content-Length bytes."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a full reply: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        rest += conn.recv(65536)
    return status, headers, rest[:length]


def closed_by_server(conn: socket.socket, wait: float = 2) -> bool:
    """True when the server closes the connection within `wait` seconds."""
    conn.settimeout(wait)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_keep_alive_serves_the_latest_body_on_one_connection(server):
    port, bodies = server
    with connect(port) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = read_reply(conn)
        assert status == "HTTP/1.1 200 OK" and body == b"metric_a 1\n"
        assert headers["content-type"] == "text/plain; version=0.0.4" and "connection" not in headers
        bodies.append(b"metric_a 2\n")  # a new report was rendered
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n")  # pipelined
        assert read_reply(conn)[2] == b"metric_a 2\n" and read_reply(conn)[2] == b"metric_a 2\n"


@pytest.mark.parametrize("request_bytes", [
    b"GET /metrics HTTP/1.0\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
])
def test_http10_and_connection_close_end_the_connection(server, request_bytes):
    port, _ = server
    with connect(port) as conn:
        conn.sendall(request_bytes)
        status, headers, body = read_reply(conn)
        assert status.endswith("200 OK") and headers["connection"] == "close" and body
        assert closed_by_server(conn)


def test_head_has_headers_and_no_body(server):
    port, _ = server
    with connect(port) as conn:
        conn.sendall(b"HEAD /metrics HTTP/1.1\r\n\r\n")
        data = conn.recv(65536)
        assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"\r\n\r\n") and b"Content-Length: 11" in data


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
    with connect(port) as conn:
        conn.sendall(request_bytes)
        got, _, body = read_reply(conn)
        assert got == f"HTTP/1.1 {status}" and body
        assert closed_by_server(conn) == closes
    with connect(port) as conn:  # and the server goes on serving
        conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert read_reply(conn)[0].endswith("200 OK")


def test_idle_connection_is_closed(server, monkeypatch):
    monkeypatch.setattr(http, "IDLE_TIMEOUT_S", 0.2)
    port, _ = server
    with connect(port) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        read_reply(conn)
        assert closed_by_server(conn)


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
