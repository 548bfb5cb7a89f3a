"""`nodecheck serve` as a process: TLS, mutual TLS and basic auth from a web config, a port already taken,
and scrapes that never fail while one probe hangs and another fails (load: 200 concurrent clients)."""

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_serve_faults  # noqa: E402
from helpers import (
    fake_executable,
    free_port,
    h100_node_snapshot,
    in_private_network,
    make_ca_and_certs,
    start_serve,
    stop,
    wait_metrics,
    wait_until,
)


def web_config(tmp_path, **sections) -> str:
    import yaml

    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


def test_tls_and_mutual_tls(tmp_path):
    make_ca_and_certs(tmp_path)
    snap = h100_node_snapshot(tmp_path / "h100")
    port = free_port()
    config = web_config(tmp_path, tls_server_config={
        "cert_file": str(tmp_path / "server.pem"), "key_file": str(tmp_path / "server.key"),
        "client_ca_file": str(tmp_path / "ca.pem"), "client_auth_type": "RequireAndVerifyClientCert"})
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--from", str(snap), "--web-config", config)
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        context.load_cert_chain(str(tmp_path / "client.pem"), str(tmp_path / "client.key"))
        text = wait_metrics(f"https://127.0.0.1:{port}/metrics", context)
        assert 'nodecheck_gpu_info{UUID="GPU-c1752cd3-f0b4-c321-10f7-4e1dbf62ea62"' in text
        no_client_cert = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5, context=no_client_cert).read()
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        stop(proc)


def test_basic_auth(tmp_path):
    bcrypt = pytest.importorskip("bcrypt", reason="needs bcrypt (sh deploy/install.sh web)")
    import base64

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")  # htpasswd spells it $2y$
    port = free_port()
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--from", str(h100_node_snapshot(tmp_path / "h")),
                       "--web-config", web_config(tmp_path, basic_auth_users={"prometheus": hashed}))
    url = f"http://127.0.0.1:{port}/metrics"

    def get(user: str, password: str) -> int:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except urllib.error.URLError:
            return 0  # not listening yet

    try:
        deadline = time.monotonic() + 30
        while get("prometheus", "s3cret") != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert get("prometheus", "s3cret") == 200
        assert get("prometheus", "wrong") == 401 and get("nobody", "s3cret") == 401
        # a password past bcrypt's 72 bytes, and a header that is not ASCII, got an empty reply where a 401 belongs
        assert get("prometheus", "s3cret" + "x" * 80) == 401
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(b"GET /metrics HTTP/1.1\r\nAuthorization: Basic \xc3\xa9t\xc3\xa9\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 401 ")
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(url, timeout=5)
        assert anonymous.value.code == 401 and anonymous.value.headers["WWW-Authenticate"] == 'Basic realm="nodecheck"'
    finally:
        stop(proc)


@pytest.mark.parametrize("sections,message", [
    ({"tls_server_config": {"cert_file": "a.pem"}}, "'tls_server_config.key_file': expected a file path"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAndVerifyClientCert"}},
     "RequireAndVerifyClientCert needs a CA file"),
    ({"basic_auth_users": {"prometheus": "plaintext"}}, "'basic_auth_users.prometheus': expected a bcrypt hash"),
    ({"http_server_config": {}}, "unknown key 'http_server_config'"),
    ({"basic_auth_users": {"prometheus": "$2y$10$notavalidhash"}}, "'basic_auth_users.prometheus': not a valid bcrypt hash"),
    ({"basic_auth_users": {"prometheus": "$2y$31$" + "a" * 53}}, "bcrypt cost '31' is not 4..18"),
    ({"tls_server_config": -1}, "'tls_server_config': expected a mapping of cert_file, key_file ..., got -1"),  # fuzz, seed 777
    ({"basic_auth_users": ["prometheus"]}, "'basic_auth_users': expected user: bcrypt-hash pairs, got ['prometheus']"),
    ({"basic_auth_users": 0}, "'basic_auth_users': expected user: bcrypt-hash pairs, got 0"),
])
def test_bad_web_config_is_a_clear_error(tmp_path, sections, message):
    pytest.importorskip("yaml", reason="needs PyYAML (sh deploy/install.sh web)")
    config = web_config(tmp_path, **sections)
    proc = start_serve("--listen", f"127.0.0.1:{free_port()}", "--web-config", config)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and message in out and config in out


def test_users_with_different_bcrypt_costs_are_warned_of(tmp_path):
    """An unknown name is checked against a decoy at the highest cost in use, so a user with a cheaper hash is
    refused sooner than a name that does not exist: valid, but it tells a prober the name. serve says so."""
    bcrypt = pytest.importorskip("bcrypt", reason="needs bcrypt (sh deploy/install.sh web)")
    from nodecheck.prometheus.webconfig import parse_web_config

    cheap, dear = (bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=r)).decode() for r in (4, 5))
    (warning,) = parse_web_config(f"basic_auth_users:\n  grafana: '{cheap}'\n  prometheus: '{dear}'\n", "web.yml").warnings
    assert "costs differ (grafana 4, prometheus 5)" in warning and "for 'grafana' is refused sooner" in warning
    assert parse_web_config(f"basic_auth_users:\n  grafana: '{cheap}'\n  other: '{cheap}'\n", "web.yml").warnings == []
    port = free_port()
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--from", str(h100_node_snapshot(tmp_path / "h")),
                       "--web-config", web_config(tmp_path, basic_auth_users={"grafana": cheap, "prometheus": dear}))
    try:
        wait_until(lambda: _listening(port), 30, "serve listening")
    finally:
        out = stop(proc)
    assert "WARNING" in out and "bcrypt costs differ (grafana 4, prometheus 5)" in out, out


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_web_config_that_is_not_utf8_is_a_clear_error(tmp_path):
    pytest.importorskip("yaml", reason="needs PyYAML (sh deploy/install.sh web)")
    config = tmp_path / "web.yml"
    config.write_bytes(b"basic_auth_users:\n  \xff\xfe: x\n")
    proc = start_serve("--listen", f"127.0.0.1:{free_port()}", "--web-config", str(config))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "is not UTF-8 text" in out and "Traceback" not in out


def test_port_taken(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        (tmp_path / "identity.json").write_text('{"hostname": "n"}')  # a snapshot, of a node with little in it
        proc = start_serve("--listen", f"127.0.0.1:{port}", "--from", str(tmp_path))
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and f"cannot serve on 127.0.0.1:{port}" in out


def test_scrapes_never_fail_while_probes_hang_or_fail(tmp_path):
    """A live host whose nvidia-smi hangs (killed at the probe's timeout) and whose lstopo prints garbage,
    probed every second, under 20 concurrent scrapers for 5 s: every scrape answers 200 with metrics.
    The 200-client, 30 s version is benchmarks/bench_serve_faults.py."""
    port = free_port()
    env = dict(os.environ, PATH=f"{bench_serve_faults.hostile_bin(tmp_path / 'bin')}:{os.environ['PATH']}")
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--interval", "1", env=env)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_metrics(url, seconds=60)
        successes, failures = bench_serve_faults.scrape_load(url, clients=20, seconds=5)
        final = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        stop(proc)
    assert failures == [] and successes > 20, (len(failures), failures[:3], successes)
    assert 'nodecheck_probe_success{probe="lstopo"} 0.0' in final
    assert 'nodecheck_probe_success{probe="nvidia_smi_topo"} 0.0' in final  # killed at its timeout, recorded


def test_scheduled_bench_runs_in_a_subprocess_and_lands_in_the_metrics(tmp_path):
    """Launched as a 2-rank job whose MASTER_ADDR is missing, the scheduled bench reports its failure as
    metrics and a finding; the daemon keeps serving and never imports torch itself."""
    port = free_port()
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="", MASTER_PORT=str(free_port()))
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--from", str(h100_node_snapshot(tmp_path / "h")),
                       "--bench-every", "1", env=env)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_metrics(url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            if "nodecheck_bandwidth_test_success{" in text:
                break
            time.sleep(0.5)
        daemon_modules = open(f"/proc/{proc.pid}/maps").read()
    finally:
        stop(proc)
    assert 'nodecheck_bandwidth_test_success{direction="busbw",path="allreduce:2-ranks",test="allreduce"} 0.0' in text
    assert 'nodecheck_finding{kind="bench_failed",severity="error",subject="allreduce:2-ranks"} 1.0' in text
    assert "nodecheck_bandwidth_timestamp_seconds" in text
    assert "libtorch" not in daemon_modules


def test_a_scheduled_bench_waits_while_a_gpu_is_busy(tmp_path):
    """`serve --bench-every` on a node whose GPU runs someone's work (the real H100's NVML values, utilization
    95%): a bench there measured the job (a slow verdict, with --kubernetes-taint a taint) and slowed it. The
    round is skipped and said; no figure is published. The same node idle is benched (the test above)."""
    import json
    import threading

    from helpers import h100_nvml_records

    snap = h100_node_snapshot(tmp_path / "h")
    nvml = json.loads((snap / "nvml.json").read_text())
    nvml["gpus"][0]["utilization_gpu"] = 95
    (snap / "nvml.json").write_text(json.dumps(nvml))
    assert h100_nvml_records()  # the capture is there: the node is the real one, busy
    port = free_port()
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="", MASTER_PORT=str(free_port()))
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--from", str(snap), "--bench-every", "1",
                       "--log-level", "info", env=env)
    lines: list[str] = []

    def read() -> None:  # the daemon's log, line by line, as it comes
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: sum("bench round skipped" in line for line in lines) >= 2, 60, "two skipped bench rounds")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    (said,) = {line.split("] ", 1)[-1].strip() for line in lines if "bench round skipped" in line}
    assert "gpu0 at 95% busy" in said, said
    assert "nodecheck_bandwidth_test_success{" not in text and "bench run:" not in "".join(lines)


def test_listen_address_from_config_flag_or_default(tmp_path):
    """--listen over [serve] listen over the default port 10042; a malformed address is a usage error."""
    snap = str(h100_node_snapshot(tmp_path / "h"))
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f'[serve]\nlisten = "127.0.0.1:{port}"\ninterval = 30\n')
    proc = start_serve("--from", snap, "--config", str(config))
    try:
        assert "nodecheck_gpu_info" in wait_metrics(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop(proc)
    bad = start_serve("--listen", "localhost", "--from", snap)
    out, _ = bad.communicate(timeout=30)
    assert bad.returncode == 2 and "expected HOST:PORT" in out
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("the default port is tried in a network namespace of its own (root, unshare, ip)")
    # in a private network namespace: the fixed default port cannot meet another suite's exporter
    probe = ("import subprocess, sys, time, urllib.request\n"
             f"proc = subprocess.Popen([sys.executable, '-m', 'nodecheck', 'serve', '--from', {snap!r}, '--config', {str(empty)!r}])\n"
             "try:\n"
             "    for _ in range(300):\n"
             "        try:\n"
             "            print(urllib.request.urlopen('http://127.0.0.1:10042/metrics', timeout=2).read().decode()); break\n"
             "        except OSError:\n"
             "            time.sleep(0.1)\n"
             "finally:\n"
             "    proc.terminate(); proc.wait(10)\n")
    scraped = subprocess.run(in_private_network([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=60)
    assert "nodecheck_gpu_info" in scraped.stdout, scraped.stderr[-2000:]


def test_before_the_first_report_503_and_sigterm_ends_hung_probes(tmp_path):
    """While the first probe round waits on a hung nvidia-smi, scrapes get 503 (never a body without a
    Report); SIGTERM then ends the daemon and the hung nvidia-smi with it."""
    bin_dir, pidfile = tmp_path / "bin", tmp_path / "nvidia-smi.pid"
    bin_dir.mkdir()
    fake_executable(bin_dir / "nvidia-smi", f"echo $$ > {pidfile}\nexec sleep 120\n")
    port = free_port()
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--interval", "60",
                       env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"))
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline, "nvidia-smi was never started"
            time.sleep(0.1)
        status = None
        while status is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                status = 200
            except urllib.error.HTTPError as error:
                status = error.code
            except urllib.error.URLError:
                time.sleep(0.1)  # not listening yet
        assert status == 503
    finally:
        out = stop(proc)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, f"nvidia-smi {pid} outlived the daemon: {out[-500:]}"
        time.sleep(0.1)


def test_measurements_another_node_wrote_are_refused_naming_both(tmp_path):
    """`serve --measurements FILE` on a path every node shares published one node's bench figures as every node's:
    a node never measured read as healthy. A bench Report naming another node is now refused (logged, nothing
    published from it); the same file written on this node is published."""
    from helpers import REPO

    node = REPO / "examples" / "hgx-h100-8gpu"  # hostname hgx-example-01, as the example job's Report names it
    job = (REPO / "examples" / "job-8node-allreduce.json").read_text()
    measurements = tmp_path / "bench.json"
    measurements.write_text(job.replace('"hostname": "hgx-example-01"', '"hostname": "gpu-07"', 1))
    port = free_port()
    proc = start_serve("--listen", f"127.0.0.1:{port}", "--from", str(node), "--interval", "1",
                       "--measurements", str(measurements))
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        assert "nodecheck_bandwidth_ratio{" not in wait_metrics(url)
        measurements.write_text(job)
        wait_until(lambda: "nodecheck_bandwidth_ratio{" in urllib.request.urlopen(url, timeout=5).read().decode(), 30,
                   "the measurements of this node to be published")
    finally:
        out = stop(proc)
    assert "written by `nodecheck bench` on 'gpu-07', not on this node ('hgx-example-01')" in out, out[-2000:]


def test_a_jobs_slow_allreduce_blamed_on_other_nodes_is_not_this_nodes(tmp_path):
    """Rank 0's Report (`nodecheck-allreduce`'s OUT.json) fed to `serve --measurements` on rank 0's node: its
    all-reduce across nodes was slow, and the pair exchanges found node hgx-03 slow in every exchange. Published as
    this node's, it raised the alert, the Kubernetes condition and the taint on hgx-example-01, which the exchanges
    cleared. It is the job's verdict: left out here; kept where this node is among the slow, or where the exchanges
    named no one (two nodes cannot be told apart: both are named)."""
    from helpers import REPO

    from nodecheck.bench.plan import read_measurements_file

    job = json.loads((REPO / "examples" / "job-8node-allreduce.json").read_text())
    (m,) = job["measurements"]
    hosts = ["hgx-example-01", "hgx-02", "hgx-03"]
    m["details"]["nodes"] = [{"rank": r, "local_rank": 0, "node": hosts[r], "address": f"198.18.0.{r + 1}"} for r in range(3)]
    spec = 50e9

    def exchange(round_, a, b, ratio):
        return {"round": round_, "a": a, "b": b, "a_to_b": ratio * spec, "b_to_a": ratio * spec, "spec": spec}

    def served(slow_rank: int | None, exchanges=None) -> list[str]:
        ratio = {r: (0.3 if r == slow_rank else 0.95) for r in range(3)}
        m["details"]["pair_exchanges"] = exchanges or [exchange(0, 0, 1, min(ratio[0], ratio[1])),
                                                       exchange(1, 1, 2, min(ratio[1], ratio[2])),
                                                       exchange(2, 0, 2, min(ratio[0], ratio[2]))]
        m["ratio"], m["bytes_per_second"] = (0.35, 0.35 * 400e9) if slow_rank is not None or exchanges else (0.97, 388e9)
        (tmp_path / "bench.json").write_text(json.dumps(job))
        return [x.path for x in read_measurements_file(tmp_path / "bench.json", "hgx-example-01")[0]]

    assert served(2) == []  # hgx-03 slow: its figure is the job's
    assert served(0) == ["allreduce:64-ranks"]  # this node slow: its own
    assert served(None) == ["allreduce:64-ranks"]  # healthy: published as before
    both = [exchange(0, 0, 1, 0.3)]  # rank 0 and 1 alone, slow together: both named, this node among them
    m["details"]["nodes"] = m["details"]["nodes"][:2]
    assert served(None, both) == ["allreduce:64-ranks"]
