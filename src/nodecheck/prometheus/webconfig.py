"""The Prometheus exporter-toolkit web configuration file (the format node_exporter's
--web.config.file reads): TLS and basic auth for `nodecheck serve --web-config FILE`.

    tls_server_config:
      cert_file: /etc/nodecheck/tls.crt
      key_file: /etc/nodecheck/tls.key
      client_ca_file: /etc/nodecheck/ca.crt          # optional
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default)
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

Needs the extra `web` (PyYAML, bcrypt: `sh deploy/install.sh web`), imported only when a web config is given.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from nodecheck.config import check_known_keys, read_config_text
from nodecheck.core.errors import ConfigError, install_extra

_CLIENT_AUTH = ("NoClientCert", "RequireAndVerifyClientCert")
MAX_BCRYPT_COST = 18  # about 15 s per check on a server core: beyond it every new scraper would wait minutes


@dataclass
class WebConfig:
    tls: dict = field(default_factory=dict)  # certfile, keyfile, client_cafile
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    warnings: list[str] = field(default_factory=list)  # what serve logs at start: valid, but weaker than it looks


def load_web_config(path: Path) -> WebConfig:
    config = parse_web_config(read_config_text(path, "web config"), path)
    for key, file in (config.tls or {}).items():
        _regular_file(file, key, path)
    return config


def _regular_file(file: str, key: str, path: Path | str) -> None:
    """A TLS file must be a regular file: OpenSSL opening a named pipe waits for a writer forever, and serve
    never started (nor said why)."""
    try:
        mode = os.stat(file).st_mode
    except OSError as error:
        raise ConfigError(f"{path}: the TLS {key} {file}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{path}: the TLS {key} {file} is not a regular file (a pipe, device or directory)")


def parse_web_config(text: str, path: Path | str) -> WebConfig:
    """A web config from its YAML text; path names it in errors."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{path}: reading a web config needs PyYAML and bcrypt: {install_extra('web')}") from None
    try:
        data = yaml.safe_load(text) or {}
    except (yaml.YAMLError, RecursionError) as error:
        raise ConfigError(f"{path}: not valid YAML ({error})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with tls_server_config and/or basic_auth_users")
    check_known_keys(data, ("tls_server_config", "basic_auth_users"), "", path)
    config = WebConfig()
    tls = _section(data, "tls_server_config", "a mapping of cert_file, key_file ...", path)
    if tls:
        check_known_keys(tls, ("cert_file", "key_file", "client_ca_file", "client_auth_type"), "tls_server_config.", path)
        for key in ("cert_file", "key_file"):
            if not isinstance(tls.get(key), str):
                raise ConfigError(f"{path}: key 'tls_server_config.{key}': expected a file path")
        auth = tls.get("client_auth_type", "NoClientCert")
        if auth not in _CLIENT_AUTH:
            raise ConfigError(f"{path}: key 'tls_server_config.client_auth_type': expected one of {', '.join(_CLIENT_AUTH)}, got {auth!r}")
        if auth == "RequireAndVerifyClientCert" and not isinstance(tls.get("client_ca_file"), str):
            raise ConfigError(f"{path}: key 'tls_server_config.client_ca_file': RequireAndVerifyClientCert needs a CA file")
        config.tls = {"certfile": tls["cert_file"], "keyfile": tls["key_file"]}
        if auth == "RequireAndVerifyClientCert":
            config.tls["client_cafile"] = tls["client_ca_file"]
    users = _section(data, "basic_auth_users", "user: bcrypt-hash pairs", path)
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"{path}: key 'basic_auth_users.{user}': expected a bcrypt hash ($2y$...)")
        config.users[str(user)] = hashed.encode()
    if config.users:
        try:
            import bcrypt  # fail now, not at the first scrape
        except ImportError:
            raise ConfigError(f"{path}: basic_auth_users needs bcrypt: {install_extra('web')}") from None
        costs = {user: _cost(hashed) for user, hashed in config.users.items()}
        if len(set(costs.values())) > 1:  # an unknown name is checked at the highest cost (BasicAuth's decoy)
            cheapest = min(costs, key=costs.get)
            config.warnings.append(f"{path}: basic_auth_users' bcrypt costs differ ({', '.join(f'{u} {c}' for u, c in costs.items())}): "
                                   f"a wrong password for {cheapest!r} is refused sooner than one for a name that does not "
                                   "exist, which tells a prober the name exists; give every user one cost")
        for user, hashed in config.users.items():
            if not 4 <= costs[user] <= MAX_BCRYPT_COST:
                raise ConfigError(f"{path}: key 'basic_auth_users.{user}': bcrypt cost {hashed[4:6].decode()!r} is not "
                                  f"4..{MAX_BCRYPT_COST} (each step doubles the work; 31 would take days per check)")
            try:  # a hash bcrypt cannot use would fail every scrape by that user: refuse it now
                bcrypt.checkpw(b"", hashed)
            except ValueError as error:
                raise ConfigError(f"{path}: key 'basic_auth_users.{user}': not a valid bcrypt hash ({error})") from None
    return config


def _section(data: dict, key: str, expected: str, path) -> dict:
    """A top-level section: {} when absent or empty, else it must be a mapping (`tls_server_config: -1` is a
    mistake to name, not to skip)."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: key '{key}': expected {expected}, got {value!r:.60}")
    return value


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes. bcrypt is slow on purpose (tens of ms), so
    credentials that passed once are remembered by their SHA-256, as exporter-toolkit caches them."""

    def __init__(self, users: dict[str, bytes]) -> None:
        import bcrypt

        self.users = users
        self._passed: set[bytes] = set()
        self._lock = threading.Lock()
        # what an unknown user's password is checked against: the highest bcrypt cost in use, so that no
        # unknown name answers sooner than a known one (with the lowest, 1.9 ms against a known user's 60 ms)
        cost = max((_cost(h) for h in users.values()), default=10)
        self._decoy = bcrypt.hashpw(b"nodecheck: no such user", bcrypt.gensalt(rounds=cost))

    def remembered(self, header: str | None) -> bool | None:
        """True for credentials that passed before, False for a malformed header, None when only bcrypt
        can tell (then call allows, off any event loop). An unknown user also takes the bcrypt path:
        answering it sooner would tell a prober which user names exist."""
        credentials = _credentials(header)
        if credentials is None:
            return False
        with self._lock:
            return True if _digest(*credentials) in self._passed else None

    def allows(self, header: str | None) -> bool:
        credentials = _credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        digest = _digest(user, password)
        with self._lock:
            if digest in self._passed:
                return True
        import bcrypt

        hashed = self.users.get(user)
        secret = password.encode()
        # bcrypt reads 72 bytes at most (bcrypt 5 refuses more with ValueError: an empty reply where a 401 belongs):
        # a longer password fails, after the same bcrypt work as any other
        matches = bcrypt.checkpw(secret[:BCRYPT_MAX_BYTES], hashed or self._decoy) and len(secret) <= BCRYPT_MAX_BYTES
        if hashed is None or not matches:
            return False
        with self._lock:
            self._passed.add(digest)
        return True


BCRYPT_MAX_BYTES = 72


def _cost(hashed: bytes) -> int:
    """The log2 rounds of a bcrypt hash ($2y$10$... -> 10)."""
    return int(hashed[4:6]) if hashed[4:6].isdigit() else 10


def _credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header.startswith("Basic "):
        return None
    try:  # a header with non-ASCII characters is ValueError to b64decode: a malformed header, a 401
        user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return user, password


def _digest(user: str, password: str) -> bytes:
    return hashlib.sha256(f"{user}\0{password}".encode()).digest()
