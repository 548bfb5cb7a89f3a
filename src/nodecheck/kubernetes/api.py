"""The Kubernetes API as a pod's service account reaches it from inside the cluster: https at
$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the server's certificate checked against the account's ca.crt,
the account's bearer token read again for every request (kubelet rotates bound tokens). Only what node_health.py
needs, without the kubernetes client package: a JSON request with a timeout, a bounded answer, and retries with
exponential backoff and jitter on what a retry can cure (a refused or dropped connection, 429, 5xx), honouring
Retry-After. Anything else (401, 403, 404, 409, 422) is an ApiError at once, with the server's own message."""

from __future__ import annotations

import http.client
import json
import random
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nodecheck.core import typed_json
from nodecheck.core.errors import NodecheckError
from nodecheck.host.http_call import cut_at_deadline, read_body
from nodecheck.report.findings import one_line

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_ANSWER = 4 * 1024 * 1024  # a Node with a few hundred images listed is ~100 KiB
MAX_TOKEN = 64 * 1024
RETRYABLE = frozenset({429, 500, 502, 503, 504})


class ApiError(NodecheckError):
    """A request the API server refused, or that could not be made; status 0 when no answer came."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Backoff:
    """attempts in all; the wait before retry n (from 0) is base_s x 2^n capped at cap_s, jittered down to half
    so that a thousand nodes coming back from one API outage do not knock together (Retry-After wins)."""

    attempts: int = 5
    base_s: float = 0.5
    cap_s: float = 30.0

    def delay(self, retry: int, retry_after: float | None, jitter: Callable[[float], float]) -> float:
        if retry_after is not None:
            return min(self.cap_s, max(0.0, retry_after))
        return jitter(min(self.cap_s, self.base_s * 2 ** retry))


def half_jitter(delay: float) -> float:
    return random.uniform(delay / 2, delay)  # noqa: S311 - spreading retries, not a secret


class ApiClient:
    """wait(seconds) sleeps between retries and returns True when the caller is stopping (serve's stop Event's
    wait): a SIGTERM ends the retries at once."""

    def __init__(self, host: str, port: int, credentials: Path, timeout: float = 10.0, backoff: Backoff = Backoff(),
                 wait: Callable[[float], bool] | None = None, jitter: Callable[[float], float] = half_jitter) -> None:
        self.host, self.port, self.credentials, self.timeout = host, port, credentials, timeout
        self.backoff, self.jitter = backoff, jitter
        self.wait = wait or (lambda seconds: time.sleep(seconds) or False)
        ca = credentials / "ca.crt"
        try:
            self.context = ssl.create_default_context(cafile=str(ca))
        except (OSError, ssl.SSLError) as error:
            raise NodecheckError(f"the API server's CA {ca}: {getattr(error, 'strerror', None) or error}") from None
        self.token()  # an account without a token is a configuration error now, not one per request

    @classmethod
    def in_cluster(cls, environ: dict[str, str], credentials: Path = SERVICE_ACCOUNT, **options) -> ApiClient:
        host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise NodecheckError("KUBERNETES_SERVICE_HOST is not set: --kubernetes-* options work only in a pod")
        if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
            raise NodecheckError(f"KUBERNETES_SERVICE_PORT {port[:20]!r}: not a port")
        return cls(host.strip("[]"), int(port), credentials, **options)

    def token(self) -> str:
        path = self.credentials / "token"
        try:
            with open(path, "rb") as file:
                raw = file.read(MAX_TOKEN + 1)
        except OSError as error:
            raise NodecheckError(f"the service account token {path}: {error.strerror or error}") from None
        token = raw.decode("ascii", "replace").strip()
        if not token or len(raw) > MAX_TOKEN or any(c.isspace() or not c.isprintable() for c in token):
            raise NodecheckError(f"the service account token {path}: empty, too long or not a token")
        return token

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        """The answer's JSON object; ApiError when refused or when every attempt failed."""
        for retry in range(self.backoff.attempts):
            status, answer, retry_after = self._once(method, path, body, content_type)
            if 200 <= status < 300:
                return _object(answer, method, path)
            error = ApiError(status, f"{method} {path}: {_status_text(status, answer)}")
            if status and status not in RETRYABLE:
                raise error
            if retry + 1 == self.backoff.attempts or self.wait(self.backoff.delay(retry, retry_after, self.jitter)):
                raise error
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _once(self, method: str, path: str, body: dict | None, content_type: str) -> tuple[int, bytes, float | None]:
        """(status, body, Retry-After seconds); status 0 with the reason when no answer came."""
        headers = {"Authorization": f"Bearer {self.token()}", "Accept": "application/json", "User-Agent": "nodecheck"}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        connection = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.context)
        # the socket's timeout is per read: a server that trickles a header byte every few seconds never trips it.
        # The whole call has one deadline; past it the socket is shut, and the blocked read returns an error.
        cutoff = cut_at_deadline(connection, self.timeout)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            answer = read_body(response, MAX_ANSWER, time.monotonic() + self.timeout)
            if cutoff.fired.is_set():  # cut mid-header, http.client may read the rest as an empty answer
                return 0, b"no answer within the call's deadline", None
            return response.status, answer, _retry_after(response.getheader("Retry-After"))
        except (OSError, http.client.HTTPException, NodecheckError, ValueError) as error:  # refused, reset, cut, TLS, too large
            said = "no answer within the call's deadline" if cutoff.fired.is_set() else (
                getattr(error, "strerror", None) or error or type(error).__name__)
            return 0, str(said).encode(), None
        finally:
            cutoff.cancel()
            connection.close()


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None and value.strip().isascii() and value.strip().isdigit() else None
    except ValueError:
        return None


def _object(answer: bytes, method: str, path: str) -> dict:
    try:
        document = typed_json.loads(answer)
    except (ValueError, RecursionError):  # a deep answer: an error, not a traceback every round
        document = None
    if not isinstance(document, dict):
        raise ApiError(0, f"{method} {path}: the answer is not a JSON object")
    return document


def _status_text(status: int, answer: bytes) -> str:
    """The API server's Status message when it sent one ("nodes "x" is forbidden: User ... cannot patch ...")."""
    if not status:
        return f"no answer ({one_line(answer.decode('utf-8', 'replace')[:200])})"
    try:
        document = typed_json.loads(answer)
        message = document.get("message") if isinstance(document, dict) else None
    except (ValueError, RecursionError):
        message = None
    text = message if isinstance(message, str) and message else answer.decode("utf-8", "replace")
    return f"{status} {one_line(' '.join(text.split())[:300])}"
