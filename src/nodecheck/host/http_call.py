"""HTTP calls to servers nodecheck does not control (a Prometheus, the Kubernetes API server), held to one deadline
for the whole call: a socket's timeout is per read, and a server that trickles a byte every few seconds never trips
it (a trickled Prometheus answer kept `fleet --prometheus` running past 400 s). Bodies are bounded, redirects are
not followed (one to ftp:// was), and every failure is a NodecheckError naming what went wrong."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.parse

from nodecheck.core.errors import NodecheckError


def cut_at_deadline(connection: http.client.HTTPConnection, seconds: float) -> threading.Timer:
    """A started timer that shuts the connection's socket after `seconds`: a read blocked on it returns at once.
    Cancel it when the call is done; `fired.is_set()` says it fired (set before the socket is shut: the Timer's own
    `finished` is set after, and a reader woken by the shutdown could look before it)."""
    fired = threading.Event()

    def cut() -> None:
        fired.set()
        sock = connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    timer = threading.Timer(seconds, cut)
    timer.fired = fired
    timer.daemon = True
    timer.start()
    return timer


def read_body(response: http.client.HTTPResponse, limit: int, deadline: float) -> bytes:
    """At most `limit` bytes (NodecheckError past it), no read after the deadline."""
    chunks, size = [], 0
    while chunk := response.read1(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise NodecheckError(f"an answer larger than {limit >> 20} MiB")
        if time.monotonic() > deadline:
            raise NodecheckError("the answer did not finish within the deadline")
        chunks.append(chunk)
    if response.length:  # fewer bytes than its Content-Length said: read1 ends quietly at the close
        raise NodecheckError("the answer was cut short")
    return b"".join(chunks)


def get(url: str, timeout: float, limit: int) -> bytes:
    """The body of a 2xx answer to GET url (http or https), within `timeout` seconds in all and `limit` bytes."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NodecheckError("expected an http:// or https:// URL")
    try:
        port = parts.port
    except ValueError:
        raise NodecheckError("the URL's port is not a port") from None
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, port, timeout=timeout)
    started = time.monotonic()
    timer = cut_at_deadline(connection, timeout)
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    try:
        connection.request("GET", target, headers={"Accept": "application/json", "User-Agent": "nodecheck"})
        response = connection.getresponse()
        try:
            body = read_body(response, limit, started + timeout)
        finally:
            if timer.fired.is_set():  # the cut ends a trickle mid-body: said as what it is
                raise NodecheckError(f"no whole answer within {timeout:g} s")
        if 300 <= response.status < 400:  # the URL given is the one asked: a redirect is named, not followed
            location = (response.getheader("Location") or "")[:120]
            raise NodecheckError(f"answered {response.status}, a redirect to {location!r}: not followed (give that URL)")
        if not 200 <= response.status < 300:
            raise NodecheckError(f"answered {response.status} {response.reason[:80]}")
        return body
    except http.client.IncompleteRead:
        raise NodecheckError("the answer was cut short") from None
    except (http.client.HTTPException, ssl.SSLError, OSError) as error:
        if timer.fired.is_set():
            raise NodecheckError(f"no whole answer within {timeout:g} s") from None
        what = "not an HTTP answer" if isinstance(error, http.client.BadStatusLine) else (
            getattr(error, "strerror", None) or str(error) or type(error).__name__)
        raise NodecheckError(str(what)[:200]) from None
    finally:
        timer.cancel()
        connection.close()
