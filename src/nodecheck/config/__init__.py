"""Expectations of a node, from one TOML file. Every wrong key or value is a ConfigError that
names the file, the key and what was expected. `config_init.generate()` writes a known-good node's facts as a
starting config (like NHC's genconf), so a fleet is checked against its own golden node."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from nodecheck.config.topology import topology_pairs
from nodecheck.core.errors import ConfigError
from nodecheck.core.limits import MAX_LINK_MBPS
from nodecheck.core.link_types import LINK_TYPE
from nodecheck.report.findings import SEVERITIES
from nodecheck.report.gpu import COMPUTE_MODE_SETTINGS
from nodecheck.report.model import BENCH_TESTS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# what [gpus] accepts, (low, high) each: `config init` writes no other value (a snapshot's NVML may say anything)
GPU_LIMITS = {"count": (0, 1024), "pcie_gen": (1, 7), "pcie_width": (1, 32), "nvlinks_per_gpu": (0, 64)}

DEFAULT_PATH = Path("/etc/nodecheck/config.toml")
# a GPU index as nvidia-smi writes it: ASCII digits, no leading zero ("gpu0-gpu00" was one GPU paired with itself)
_PAIR = re.compile(r"^gpu(0|[1-9][0-9]{0,3})-gpu(0|[1-9][0-9]{0,3})$")
_NIC_STATES = ("up", "down", "any")
# The Prometheus allocation list's range 9100-9999 is full; 10042 sits just above it and clashes with
# nothing a GPU node runs (docs/prometheus.md, "Default port").
DEFAULT_PORT = 10042
DEFAULT_VIRTUAL_NICS = ("bond*", "team*")  # link aggregates: virtual, but their speed is their real NICs' sum
SLURMD_PORT = 6818


@dataclass
class ProximityPolicy:
    interface: str | None = None  # the job-traffic interface; None: the route to each peer decides
    port: int = SLURMD_PORT
    connect_timeout_s: float = 1.0
    rtt_factor: float = 3.0  # slower than this many times the peers' median ...
    rtt_floor_ms: float = 0.5  # ... and by at least this much: "far slower than the rest"
    severity: str = "warning"  # a far peer is the allocation's doing, not this node's: no drain by default
    max_peers: int = 16  # examined per node: those after it in the node list (proximity.chosen_peers); 0: all


@dataclass
class NicExpectation:
    speed_mbps: int | None = None
    state: str = "up"


@dataclass
class PrologSettings:
    timeout_s: float = 30.0  # the whole prolog or health check, hard
    bench: list[str] = field(default_factory=list)  # quick bandwidth tests run by the prolog (none by default)
    idle_bench: list[str] = field(default_factory=list)  # quick tests the health check runs on a node Slurm says is idle
    skip_partitions: list[str] = field(default_factory=list)
    skip_comment: str = "nodecheck:skip"  # `sbatch --comment=nodecheck:skip` skips the prolog for that job
    gpu_process_allow: list[str] = field(default_factory=lambda: ["nvidia-cuda-mps-server"])  # may hold a GPU outside jobs


@dataclass
class SlurmSettings:
    conf: str | None = None  # slurm.conf when SLURM_CONF is unset (HealthCheckProgram has none)
    node_name: str | None = None  # default: SLURMD_NODENAME, else the short host name
    scontrol_timeout_s: float = 10.0


def _xid_repeat() -> tuple[int, float]:
    from nodecheck.core.xid_catalog import repeat_defaults

    return repeat_defaults()


@dataclass
class ErrorSettings:
    """[errors]: how the error signals are judged (src/nodecheck/checks/signals.py)."""

    # a watched Xid this many times on one GPU within this long is an error, not a warning (src/nodecheck/core/data/xid.toml [repeat])
    xid_repeat_count: int = field(default_factory=lambda: _xid_repeat()[0])
    xid_repeat_window_s: float = field(default_factory=lambda: _xid_repeat()[1])
    kernel_log_lookback_s: float = 0.0  # events older than this are not judged; 0: every event since boot
    limits: dict[str, float] = field(default_factory=dict)  # [errors.limits]: overrides of specs.toml [error_limits]

    def limit(self, name: str) -> tuple[float, str]:
        """(the limit, where it comes from): the config's override, else specs.toml's with its source."""
        from nodecheck.core.specs import error_limit

        if name in self.limits:
            return self.limits[name], f"[errors.limits] {name} in the config"
        return error_limit(name)


@dataclass
class Config:
    path: str | None = None
    gpu_count: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlinks_per_gpu: int | None = None
    disabled_probes: list[str] = field(default_factory=list)  # [probes] disable: sources switched off
    ecc: bool | None = None  # [gpus] ecc: true makes ECC off an error, false silences it; unset: a warning
    mig: bool | None = None  # [gpus] mig: the MIG mode every GPU must be in (else an error); unset: MIG on is said (info)
    compute_mode: str | None = None  # [gpus] compute_mode: default, exclusive_process, prohibited (src/nodecheck/checks/compute_mode.py)
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    nics: dict[str, NicExpectation] = field(default_factory=dict)
    bandwidth_ratio: float = 0.8
    test_ratios: dict[str, float] = field(default_factory=dict)  # per bandwidth test, overrides bandwidth_ratio
    fail_severity: str = "error"
    nccl_tests: str | None = None  # path of all_reduce_perf when it is not on PATH
    listen: tuple[str, int] = ("0.0.0.0", DEFAULT_PORT)  # noqa: S104 `nodecheck serve` on every address, as node_exporter
    interval: float = 60.0  # seconds between probe rounds of `nodecheck serve`
    # [metrics] virtual_nics: the virtual NICs (no PCI device: veth, bridge, ifb, bond ...) the metrics carry,
    # by name pattern. Not every one: each pod's veth on a Kubernetes node would be a short-lived series.
    virtual_nics: list[str] = field(default_factory=lambda: list(DEFAULT_VIRTUAL_NICS))
    prolog: PrologSettings = field(default_factory=PrologSettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    proximity: ProximityPolicy = field(default_factory=ProximityPolicy)
    errors: ErrorSettings = field(default_factory=ErrorSettings)
    topology_pairs: list[tuple[str, str]] = field(default_factory=list)  # [topology] pairs: config/topology.py

    def ratio_for(self, test: str, path_kind: str | None = None, direction: str | None = None,
                  variant: str | None = None) -> float:
        return self.threshold(test, path_kind, direction, variant)[0]

    def threshold(self, test: str, path_kind: str | None = None, direction: str | None = None,
                  variant: str | None = None) -> tuple[float, str]:
        """(ratio, where it comes from): [thresholds.tests] for this test, else the calibrated default for the
        test on this kind of path (src/nodecheck/core/data/specs.toml [thresholds], each from a published healthy run),
        else [thresholds] bandwidth_ratio."""
        from nodecheck.core.specs import default_ratio

        where = self.path or "the config"
        if test in self.test_ratios:
            return self.test_ratios[test], f"[thresholds.tests] {test} in {where}"
        calibrated = default_ratio(test, path_kind, direction, variant)
        if calibrated:
            return calibrated[0], f"calibrated for {test} over {path_kind}{f' ({variant})' if variant else ''}: {calibrated[1]}"
        return self.bandwidth_ratio, (f"[thresholds] bandwidth_ratio{'' if self.path is None else ' in ' + where}: "
                                      f"no published healthy run calibrates {test} over {path_kind or 'this path'}")

    def nic_expectation(self, nic) -> NicExpectation | None:
        return self.nics.get(nic.name) or (self.nics.get(nic.rdma_device) if nic.rdma_device else None)

    def nic_speed_mbps(self, nic) -> int | None:
        expectation = self.nic_expectation(nic)
        return expectation.speed_mbps if expectation else None


def load(path: Path | None) -> Config:
    """Load `path`; with None, the default file when it exists, else no expectations."""
    if path is None:
        if not DEFAULT_PATH.is_file():
            return Config()
        path = DEFAULT_PATH
    return loads(read_config_text(path, "config"), str(path))


def loads(text: str, source: str) -> Config:
    """A config from its TOML text; source names it in errors."""
    try:
        data = tomllib.loads(text)
    except (ValueError, RecursionError) as error:  # ValueError: TOMLDecodeError, or an int of thousands of digits
        raise ConfigError(f"{source}: not valid TOML ({str(error)[:200]})") from None
    return parse(data, source)


MAX_CONFIG_BYTES = 1024 * 1024


def read_config_text(path: Path, what: str) -> str:
    """A config file's UTF-8 text: a regular file of at most MAX_CONFIG_BYTES. A FIFO, a device
    (/dev/zero), a directory or bytes that are not UTF-8 are a ConfigError naming the file."""
    from nodecheck.core.errors import NodecheckError
    from nodecheck.host.files import read_user_file

    try:
        data = read_user_file(path, MAX_CONFIG_BYTES, what)
    except NodecheckError as error:
        raise ConfigError(str(error)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: {what} is not UTF-8 text (byte {error.start})") from None


def parse(data: dict, source: str) -> Config:
    config = Config(path=source)
    check_known_keys(data, ("gpus", "links", "nics", "thresholds", "bench", "serve", "metrics", "prolog", "slurm", "proximity",
                            "probes", "errors", "topology"), "", source)
    config.topology_pairs = topology_pairs(_table(data, "topology", source), source)
    _probes(_table(data, "probes", source), config, source)
    gpus = _table(data, "gpus", source)
    check_known_keys(gpus, ("count", "pcie_gen", "pcie_width", "nvlinks_per_gpu", "ecc", "mig", "compute_mode"), "gpus.", source)
    config.gpu_count, config.pcie_gen, config.pcie_width, config.nvlinks_per_gpu = (
        _int(gpus, key, source, "gpus.", *GPU_LIMITS[key]) for key in ("count", "pcie_gen", "pcie_width", "nvlinks_per_gpu"))
    for key in ("ecc", "mig"):
        if key in gpus and not isinstance(gpus[key], bool):
            raise ConfigError(f"{source}: key 'gpus.{key}': expected true or false, got {gpus[key]!r}")
    config.ecc, config.mig = gpus.get("ecc"), gpus.get("mig")
    if gpus.get("compute_mode", "default") not in COMPUTE_MODE_SETTINGS:
        raise ConfigError(f"{source}: key 'gpus.compute_mode': expected one of {', '.join(COMPUTE_MODE_SETTINGS)}, got {gpus['compute_mode']!r}")
    config.compute_mode = gpus.get("compute_mode")
    for key, value in _table(data, "links", source).items():
        pair = _PAIR.match(key)
        if not pair or pair[1] == pair[2]:
            raise ConfigError(f"{source}: key 'links.{key[:40]}': expected a GPU pair like \"gpu0-gpu1\"")
        if not isinstance(value, str) or not LINK_TYPE.fullmatch(value) or value == "X":
            raise ConfigError(f"{source}: key 'links.{key[:40]}': expected a link type (NV#, PIX, PXB, PHB, NODE, SYS), got {value!r}")
        config.links[tuple(sorted((int(pair[1]), int(pair[2]))))] = value
    for name, table in _table(data, "nics", source).items():
        config.nics[name] = _nic(name, table, source)
    thresholds = _table(data, "thresholds", source)
    check_known_keys(thresholds, ("bandwidth_ratio", "fail_severity", "tests"), "thresholds.", source)
    config.bandwidth_ratio = _ratio(thresholds.get("bandwidth_ratio", config.bandwidth_ratio), "thresholds.bandwidth_ratio", source)
    per_test = _table(thresholds, "tests", source, "thresholds.")
    check_known_keys(per_test, BENCH_TESTS, "thresholds.tests.", source)
    config.test_ratios = {test: _ratio(value, f"thresholds.tests.{test}", source) for test, value in per_test.items()}
    bench = _table(data, "bench", source)
    check_known_keys(bench, ("nccl_tests",), "bench.", source)
    if "nccl_tests" in bench and not (isinstance(bench["nccl_tests"], str) and bench["nccl_tests"]):
        raise ConfigError(f"{source}: key 'bench.nccl_tests': expected the path of all_reduce_perf, got {bench['nccl_tests']!r}")
    config.nccl_tests = bench.get("nccl_tests")
    _serve(_table(data, "serve", source), config, source)
    metrics = _table(data, "metrics", source)
    check_known_keys(metrics, ("virtual_nics",), "metrics.", source)
    config.virtual_nics = _strings(metrics, "virtual_nics", source, "metrics.", config.virtual_nics)
    _prolog(_table(data, "prolog", source), config.prolog, source)
    _slurm(_table(data, "slurm", source), config.slurm, source)
    _proximity(_table(data, "proximity", source), config.proximity, source)
    _errors(_table(data, "errors", source), config.errors, source)
    config.fail_severity = thresholds.get("fail_severity", config.fail_severity)
    if config.fail_severity not in SEVERITIES:
        raise ConfigError(f"{source}: key 'thresholds.fail_severity': expected one of {', '.join(SEVERITIES)}, got {config.fail_severity!r}")
    return config


def _serve(table: dict, config: Config, source: str) -> None:
    check_known_keys(table, ("listen", "interval"), "serve.", source)
    if "listen" in table:
        listen = parse_listen(table["listen"]) if isinstance(table["listen"], str) else None
        if listen is None:
            raise ConfigError(f"{source}: key 'serve.listen': expected \"HOST:PORT\" or \":PORT\", got {table['listen']!r}")
        config.listen = listen
    config.interval = _number(table, "interval", source, "serve.", 1, 86400, config.interval)


def _probes(table: dict, config: Config, source: str) -> None:
    from nodecheck.probes import PROBES

    check_known_keys(table, ("disable",), "probes.", source)
    config.disabled_probes = _strings(table, "disable", source, "probes.", [])
    names = [p.name for p in PROBES]
    for name in config.disabled_probes:
        if name not in names:
            raise ConfigError(f"{source}: key 'probes.disable': unknown probe {name!r} (expected some of: {', '.join(names)})")


def _prolog(table: dict, prolog: PrologSettings, source: str) -> None:
    check_known_keys(table, ("timeout_s", "bench", "idle_bench", "skip_partitions", "skip_comment", "gpu_process_allow"),
                     "prolog.", source)
    prolog.timeout_s = _number(table, "timeout_s", source, "prolog.", 1, 3600, prolog.timeout_s)
    for key in ("bench", "idle_bench"):
        tests = _strings(table, key, source, "prolog.", getattr(prolog, key))
        if unknown := next((test for test in tests if test not in BENCH_TESTS), None):
            raise ConfigError(f"{source}: key 'prolog.{key}': unknown test {unknown!r} (expected some of: {', '.join(BENCH_TESTS)})")
        setattr(prolog, key, tests)
    prolog.skip_partitions = _strings(table, "skip_partitions", source, "prolog.", prolog.skip_partitions)
    prolog.skip_comment = _string(table, "skip_comment", source, "prolog.", prolog.skip_comment)
    prolog.gpu_process_allow = _strings(table, "gpu_process_allow", source, "prolog.", prolog.gpu_process_allow)


def _slurm(table: dict, slurm: SlurmSettings, source: str) -> None:
    check_known_keys(table, ("conf", "node_name", "scontrol_timeout_s"), "slurm.", source)
    slurm.conf = _string(table, "conf", source, "slurm.", slurm.conf)
    slurm.node_name = _string(table, "node_name", source, "slurm.", slurm.node_name)
    slurm.scontrol_timeout_s = _number(table, "scontrol_timeout_s", source, "slurm.", 1, 300, slurm.scontrol_timeout_s)


def _proximity(table: dict, policy: ProximityPolicy, source: str) -> None:
    check_known_keys(table, ("interface", "port", "connect_timeout_s", "rtt_factor", "rtt_floor_ms", "severity",
                             "max_peers"), "proximity.", source)
    policy.interface = _string(table, "interface", source, "proximity.", policy.interface)
    policy.port = _int(table, "port", source, "proximity.", 1, 65535) or policy.port
    policy.max_peers = _int(table, "max_peers", source, "proximity.", 0, 65536) if "max_peers" in table else policy.max_peers
    policy.connect_timeout_s = _number(table, "connect_timeout_s", source, "proximity.", 0.01, 60, policy.connect_timeout_s)
    policy.rtt_factor = _number(table, "rtt_factor", source, "proximity.", 1, 1000, policy.rtt_factor)
    policy.rtt_floor_ms = _number(table, "rtt_floor_ms", source, "proximity.", 0, 10000, policy.rtt_floor_ms)
    policy.severity = table.get("severity", policy.severity)
    if policy.severity not in SEVERITIES:
        raise ConfigError(f"{source}: key 'proximity.severity': expected one of {', '.join(SEVERITIES)}, got {policy.severity!r}")


def _errors(table: dict, errors: ErrorSettings, source: str) -> None:
    from nodecheck.core.specs import error_limit_names

    check_known_keys(table, ("xid_repeat_count", "xid_repeat_window_s", "kernel_log_lookback_s", "limits"), "errors.", source)
    limits = _table(table, "limits", source, "errors.")
    check_known_keys(limits, tuple(error_limit_names()), "errors.limits.", source)
    # a rate needs time between its samples: an interval of 0 divided by zero (the prolog drained "internal error")
    errors.limits = {name: _number(limits, name, source, "errors.limits.", 1 if name == "min_rate_interval_s" else 0, 1e12, 0)
                     for name in limits}
    errors.xid_repeat_count = _int(table, "xid_repeat_count", source, "errors.", 2, 1_000_000) or errors.xid_repeat_count
    errors.xid_repeat_window_s = _number(table, "xid_repeat_window_s", source, "errors.", 1, 366 * 86400, errors.xid_repeat_window_s)
    errors.kernel_log_lookback_s = _number(table, "kernel_log_lookback_s", source, "errors.", 0, 366 * 86400,
                                           errors.kernel_log_lookback_s)


def _number(table: dict, key: str, source: str, prefix: str, low: float, high: float, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"{source}: key '{prefix}{key}': expected a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _string(table: dict, key: str, source: str, prefix: str, default: str | None) -> str | None:
    value = table.get(key, default)
    if value is not None and not (isinstance(value, str) and value):
        raise ConfigError(f"{source}: key '{prefix}{key}': expected a non-empty string, got {value!r}")
    return value


def _strings(table: dict, key: str, source: str, prefix: str, default: list[str]) -> list[str]:
    value = table.get(key, default)
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ConfigError(f"{source}: key '{prefix}{key}': expected a list of strings, got {value!r}")
    return list(value)


def parse_listen(text: str) -> tuple[str, int] | None:
    """"HOST:PORT", "[v6]:PORT" or ":PORT" (all IPv4 addresses) as (host, port); None when malformed."""
    from nodecheck.core.units import to_int

    host, sep, port = text.rpartition(":")
    number = to_int(port)
    if not sep or number is None or not 0 < number < 65536:
        return None
    host = host.strip("[]")
    if host and not _listen_host(host):  # said now, by the option, not at bind as a socket error
        return None
    return host or "0.0.0.0", number  # noqa: S104 ":PORT" means every address, as node_exporter


_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _listen_host(host: str) -> bool:
    """An IP address, or a host name by RFC 1123's letters."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOSTNAME.fullmatch(host))


def check_known_keys(table: dict, keys: tuple[str, ...], prefix: str, source) -> None:
    """A ConfigError naming the file and the first key that is not one of `keys`."""
    for key in table:
        if key not in keys:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}' (expected one of: {', '.join(keys)})")


def _table(data: dict, key: str, source: str, prefix: str = "") -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: key '{prefix}{key}': expected a table ([{prefix}{key}]), got {value!r}")
    return value


def _ratio(value, key: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{source}: key '{key}': expected a number in (0, 1], got {value!r}")
    return float(value)


def _int(table: dict, key: str, source: str, prefix: str, low: int, high: int) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{source}: key '{prefix}{key}': expected a whole number from {low} to {high}, got {value!r}")
    return value


def _nic(name: str, table, source: str) -> NicExpectation:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: key 'nics.{name}': expected a table ([nics.{name}]), got {table!r}")
    check_known_keys(table, ("speed_mbps", "state"), f"nics.{name}.", source)
    state = table.get("state", "up")
    if state not in _NIC_STATES:
        raise ConfigError(f"{source}: key 'nics.{name}.state': expected one of {', '.join(_NIC_STATES)}, got {state!r}")
    return NicExpectation(_int(table, "speed_mbps", source, f"nics.{name}.", 1, MAX_LINK_MBPS), state)
