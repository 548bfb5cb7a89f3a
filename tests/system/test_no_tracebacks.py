"""Issue 21 (4): inputs that still reached a traceback, each now a named error (exit 2) or a named unknown."""

import json
import os
import subprocess
import sys

import pytest
from helpers import nodecheck

HUGE = "9" * 5000  # past the 4,300 digits int() converts


def no_traceback(run) -> None:
    assert "Traceback" not in run.stdout + run.stderr and "Error:" not in run.stderr.split("nodecheck")[0], run.stderr[-2000:]


def test_a_5000_digit_gpu_in_a_configs_links_is_a_config_error(tmp_path):
    config = tmp_path / "node.toml"
    config.write_text(f'[links]\ngpu{HUGE}-gpu1 = "NV18"\n')
    run = nodecheck("inspect", "--config", str(config))
    no_traceback(run)
    assert run.returncode == 2 and "expected a GPU pair like" in run.stderr and len(run.stderr) < 1000


@pytest.mark.parametrize("text", [
    "# nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
    f"  {HUGE}  {HUGE}  float  sum  -1  1.0  1.0  2.0  0  1.0  1.0  2.0  0\n",
    json.dumps({"config": {"ngpus": 1, "nthreads": 1, "devices": 1.5}, "results": [], "devices": 1.5}),
    '{"config": {"ngpus": ' + HUGE + '}, "results": []}',
])
def test_nccl_logs_with_absurd_numbers_are_read_or_refused_by_name(tmp_path, text):
    log = tmp_path / "log.txt"
    log.write_text(text)
    run = nodecheck("bench", "--nccl-log", str(log))
    no_traceback(run)
    assert run.returncode in (0, 1, 2)


@pytest.mark.parametrize("args, message", [
    (["--nodes", "9" * 400], "--nodes 1..1,000,000"),
    (["--gpus-per-node", "9" * 400], "--gpus-per-node 1..64"),
    (["--accum", "9" * 400], "--accum must be 1..1,000,000"),
])
def test_scale_refuses_counts_that_overflow(args, message):
    run = nodecheck("scale", "--params", "7e9", "--step-time", "1", "--busbw", "50GB/s", *args)
    no_traceback(run)
    assert run.returncode == 2 and message in run.stderr


def test_scale_refuses_a_step_time_that_underflows_or_overflows():
    tiny = nodecheck("scale", "--params", "7e9", "--busbw", "50GB/s", "--flops", "1e9", "--peak-tflops", "1e-320", "--mfu", "1e-300")
    no_traceback(tiny)
    assert tiny.returncode == 2 and "not a usable step time" in tiny.stderr
    huge = nodecheck("scale", "--params", "7e9", "--busbw", "50GB/s", "--step-time", "1e308", "--accum", "1000")
    no_traceback(huge)
    assert huge.returncode == 2 and "not a usable workload" in huge.stderr and "nan%" not in huge.stdout


def test_a_tls_file_that_is_a_pipe_is_refused_not_waited_on(tmp_path):
    """OpenSSL opening a FIFO waits for a writer: serve blocked at start-up forever, saying nothing."""
    pytest.importorskip("yaml")
    from nodecheck.core.errors import ConfigError
    from nodecheck.prometheus.webconfig import load_web_config

    pipe = tmp_path / "tls.crt"
    os.mkfifo(pipe)
    (tmp_path / "tls.key").write_text("not read\n")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pipe}\n  key_file: {tmp_path / 'tls.key'}\n")
    with pytest.raises(ConfigError, match="is not a regular file"):
        load_web_config(web)
    from helpers import free_port

    run = subprocess.run([sys.executable, "-m", "nodecheck", "serve", "--listen", f"127.0.0.1:{free_port()}", "--web-config", str(web)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "is not a regular file" in run.stderr


def test_unknown_users_cost_what_the_costliest_known_user_costs():
    """Users hashed at different bcrypt costs: an unknown name was checked against the cheapest (1.9 ms
    against a known user's 60 ms), telling names apart; the decoy now has the highest cost in use."""
    bcrypt = pytest.importorskip("bcrypt")
    from nodecheck.prometheus.webconfig import BasicAuth, _cost

    users = {"cheap": bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)), "dear": bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=6))}
    assert _cost(BasicAuth(users)._decoy) == 6


def test_a_rate_interval_of_zero_is_a_config_error_not_a_division(tmp_path):
    """`[errors.limits] min_rate_interval_s = 0`, which the config accepted, divided by zero: the prolog drained
    "internal error". It is refused as the config error it is."""
    config = tmp_path / "node.toml"
    config.write_text("[errors.limits]\nmin_rate_interval_s = 0\n")
    run = nodecheck("config", "check", str(config))
    no_traceback(run)
    assert run.returncode == 2 and "min_rate_interval_s': expected a number from 1" in run.stderr


@pytest.mark.parametrize("name", ["²", "1²", "٣"])
def test_a_superscript_or_other_script_digit_is_no_gpu_index(name):
    """str.isdigit takes '²' and '٣', int() does not: `clear --gpu ²` raised a traceback."""
    run = nodecheck("clear", "gpu_xid", "--gpu", name)
    no_traceback(run)
    assert run.returncode in (0, 2)


def test_a_gpu_model_named_with_a_superscript_count_is_compared_not_a_traceback():
    from nodecheck.fleet import NodeView, compare

    views = [NodeView(f"n{i}", "²x NVIDIA H100" if i == 0 else "8x NVIDIA H100", {"driver": "580"}, {"fact:gpus": 8.0})
             for i in range(7)]
    groups = compare(views)
    assert {g.sku for g in groups} == {"²x NVIDIA H100", "8x NVIDIA H100"}


@pytest.mark.parametrize("key", ["gpu0-gpu00", "gpu00-gpu1", "gpu٣-gpu1", "gpu1-gpu1"])
def test_a_links_key_naming_one_gpu_twice_or_not_as_nvidia_smi_writes_it_is_refused(tmp_path, key):
    """"gpu0-gpu00" was accepted: one GPU paired with itself."""
    config = tmp_path / "node.toml"
    config.write_text(f'[links]\n"{key}" = "NV18"\n')
    run = nodecheck("config", "check", str(config))
    no_traceback(run)
    assert run.returncode == 2 and "expected a GPU pair like" in run.stderr


@pytest.mark.parametrize("listen", ["bad host:9100", "x/y:9100", "é:9100", "a..b:9100"])
def test_a_listen_host_that_is_no_host_is_refused_by_the_option(listen):
    run = nodecheck("serve", "--listen", listen, "--from", "/nonexistent")
    no_traceback(run)
    assert run.returncode == 2 and "expected HOST:PORT" in run.stderr and "cannot serve" not in run.stderr


def test_a_garbage_tls_certificate_is_named(tmp_path):
    pytest.importorskip("yaml")
    (tmp_path / "cert.pem").write_text("garbage\n")
    (tmp_path / "key.pem").write_text("garbage\n")
    (tmp_path / "web.yml").write_text(f"tls_server_config:\n  cert_file: {tmp_path}/cert.pem\n  key_file: {tmp_path}/key.pem\n")
    from helpers import REPO, free_port

    run = nodecheck("serve", "--listen", f"127.0.0.1:{free_port()}", "--web-config", str(tmp_path / "web.yml"),
                    "--from", str(REPO / "examples" / "hgx-h100-8gpu"))
    no_traceback(run)
    assert run.returncode == 2 and f"the TLS certificate {tmp_path}/cert.pem or its key" in run.stderr


def test_a_file_that_is_neither_a_snapshot_nor_a_report_is_one_sentence(tmp_path):
    from helpers import REPO

    run = nodecheck("inspect", "--from", str(REPO / "pyproject.toml"))
    no_traceback(run)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "neither a snapshot" in run.stderr


def test_a_snapshot_into_a_directory_that_does_not_exist_creates_none(tmp_path):
    for out in (tmp_path / "no" / "such" / "x", tmp_path / "no" / "such" / "x.tar.gz"):
        run = nodecheck("snapshot", str(out))
        no_traceback(run)
        assert run.returncode == 2 and "does not exist" in run.stderr
    assert not (tmp_path / "no").exists()


def test_a_readme_is_no_nccl_log():
    """"NCCL WARN lines" in a sentence was read as an NCCL log of one warning."""
    from helpers import REPO

    run = nodecheck("nccl-log", str(REPO / "README.md"))
    no_traceback(run)
    assert run.returncode == 2 and "no NCCL debug line" in run.stderr


def test_bench_json_says_nothing_applies_with_an_empty_list(tmp_path):
    """`bench --quick --json` where no test applies printed nothing on stdout: a Report with no measurements
    comes, the reason on stderr, exit 2."""
    run = subprocess.run([sys.executable, "-m", "nodecheck", "bench", "--quick", "--json"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PATH="/usr/bin:/bin", STATE_DIRECTORY=str(tmp_path)))
    no_traceback(run)
    report = json.loads(run.stdout)
    if report.get("gpus"):
        pytest.skip("a GPU is here: tests apply")
    assert run.returncode == 2 and "no test applies" in run.stderr, run.stderr
    assert report["measurements"] == []


def test_a_gpu_test_on_a_node_without_a_gpu_says_no_gpu_not_torch(monkeypatch):
    """A missing GPU was reported as "torch is not installed"."""
    from helpers import make_report

    from nodecheck.bench import plan
    from nodecheck.config import Config

    monkeypatch.setattr(plan, "find_spec", lambda name: None)
    out = plan.run(make_report(gpus=[]), Config(), ["h2d", "allreduce"], "quick", 10, {}, None)
    said = {m.test: m.error for m in out}
    assert said["h2d"].startswith("no GPU to test") and said["allreduce"].startswith("torch is not installed")
