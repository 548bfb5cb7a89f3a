"""The install story, for real: deploy/install.sh into a temporary prefix; every deploy file runs the
command it installs; the image the DaemonSet names is built by deploy/container/build.sh (buildah, on a
Debian base that debootstrap makes) and `nodecheck inspect` and `serve` run inside it."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from helpers import REPO, as_unit_user, free_port, kubernetes_objects, wait_until

VERSION = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M)[1]
INSTALLED = "/usr/local/bin/nodecheck"  # deploy/install.sh's default link


def test_every_deploy_file_runs_what_install_sh_installs():
    install = (REPO / "deploy/install.sh").read_text()
    assert 'bin=${NODECHECK_BIN:-/usr/local/bin}' in install and 'prefix=${NODECHECK_PREFIX:-/opt/nodecheck}' in install
    for unit in ("nodecheck.service", "nodecheck-textfile.service"):
        commands = re.findall(r"^ExecStart=(\S+)", (REPO / "systemd" / unit).read_text(), re.M)
        assert commands == [INSTALLED], unit
    assert f"NODECHECK={INSTALLED} " in (REPO / "deploy/slurm/nodecheck-slurm").read_text()
    containerfile = (REPO / "deploy/container/Containerfile").read_text()
    assert "deploy/install.sh" in containerfile and f'ENTRYPOINT ["{INSTALLED}"]' in containerfile
    daemonset = kubernetes_objects("daemonset.yaml")["DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"nodecheck:{VERSION}"  # the tag build.sh gives
    for text in [(REPO / p).read_text() for p in ("systemd/nodecheck.service", "deploy/kubernetes/daemonset.yaml",
                                                  "systemd/README.md", "deploy/README.md")]:
        assert "pip install nodecheck" not in text  # not published: the install is install.sh


def test_install_sh_installs_a_working_command(system_install, tmp_path):
    command, result = system_install
    assert command.is_symlink() and os.readlink(command) == str(command.parent.parent / "opt/bin/nodecheck")
    assert result.stdout.strip().endswith(f"with /usr/bin/python3; command: {command}")  # not PATH's python3
    assert subprocess.run([str(command), "-V"], capture_output=True, text=True, timeout=60).stdout.strip() == f"nodecheck {VERSION}"
    report = json.loads(subprocess.run([str(command), "inspect", "--json"], capture_output=True, text=True, timeout=120).stdout)
    assert report["node"]["nodecheck_version"] == VERSION
    if os.geteuid() == 0:
        assert as_unit_user(str(command), "-V").stdout.strip() == f"nodecheck {VERSION}"  # what the units run
    env = dict(os.environ, NODECHECK_PREFIX=str(tmp_path / "opt"), NODECHECK_BIN=str(tmp_path / "bin"))
    refused = subprocess.run(["sh", str(REPO / "deploy/install.sh"), "bench;rm -rf /"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "extras are names separated by commas" in refused.stderr
    missing = subprocess.run(["sh", str(REPO / "deploy/install.sh")], env=dict(env, NODECHECK_PYTHON=str(tmp_path / "none")),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and f"no {tmp_path / 'none'}: apt-get install python3-venv" in missing.stderr


def test_install_sh_refuses_a_prefix_the_units_user_cannot_reach(tmp_path):
    """As root, an install the units' unprivileged user could not start (here: a prefix inside pytest's
    root-only temporary directory, as a pyenv Python under /root was) fails, says why, and leaves nothing."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("only root can check what another user can run (setpriv, util-linux)")
    assert os.stat(tmp_path.parent.parent).st_mode & 0o007 == 0  # pytest's base is root's alone
    env = dict(os.environ, NODECHECK_PREFIX=str(tmp_path / "opt"), NODECHECK_BIN=str(tmp_path / "bin"))
    result = subprocess.run(["sh", str(REPO / "deploy/install.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "an unprivileged user (the systemd units' user) cannot run" in result.stderr
    assert "under a directory only root can read" in result.stderr
    assert not (tmp_path / "opt").exists() and not (tmp_path / "bin").exists()


needs_builder = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("buildah") and shutil.which("debootstrap")),
    reason="building the image needs root, buildah and debootstrap (tests/run.sh installs them as root)")


@pytest.fixture(scope="module")
def image():
    """deploy/container/build.sh, tagged for this run alone; removed afterwards (the base stays cached)."""
    tag = f"localhost/nodecheck-test-{os.getpid()}:{VERSION}"
    result = subprocess.run(["sh", str(REPO / "deploy/container/build.sh")], env=dict(os.environ, NODECHECK_IMAGE=tag),
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    yield tag
    subprocess.run(["buildah", "rmi", "--force", tag], capture_output=True, timeout=120)


@pytest.fixture
def container(image):
    name = subprocess.run(["buildah", "from", image], capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    yield name
    subprocess.run(["buildah", "rm", name], capture_output=True, timeout=120)


def inside(container: str, *argv: str) -> list[str]:
    return ["buildah", "run", "--isolation", "chroot", container, "--", *argv]


@needs_builder
def test_inspect_runs_inside_the_image(container):
    result = subprocess.run(inside(container, "nodecheck", "inspect", "--json"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["node"]["nodecheck_version"] == VERSION
    probes = {p["name"]: p for p in report["probes"]}
    assert probes["lstopo"]["ok"] and probes["nics"]["ok"]  # the image's own lstopo; the host's /sys
    assert probes["pcie_acs"]["ok"] and report["pcie_acs"]["why"] is not None  # lspci as nobody: unknown, said why
    # nobody reads no journal here (none mounted): the image's journalctl answers "-- No entries --", and the
    # kernel log is unknown, never clean
    assert report["kernel_log"]["known"] is False and "journalctl gave no kernel messages" in report["kernel_log"]["why"]
    whoami = subprocess.run(inside(container, "id", "-u"), capture_output=True, text=True, timeout=60).stdout.strip()
    assert whoami == "65534"  # like the DaemonSet: never root


@needs_builder
def test_serve_runs_inside_the_image_and_is_scraped(container):
    import urllib.request

    port = free_port()
    proc = subprocess.Popen(inside(container, "nodecheck", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "5"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def scrape():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    try:
        metrics = wait_until(lambda: "nodecheck_probe_success" in (text := scrape()) and text, 120, "serve inside the image",
                             tolerate=(OSError,))
        assert 'nodecheck_probe_success{probe="lstopo"} 1.0' in metrics
        assert f'nodecheck_build_info{{version="{VERSION}"}} 1.0' in metrics
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        left = subprocess.run(["pgrep", "-f", f"serve --listen 127.0.0.1:{port}"], capture_output=True, text=True)
        if left.stdout.strip():  # chroot isolation: the server is the builder's child; never leave it running
            subprocess.run(["pkill", "-f", f"serve --listen 127.0.0.1:{port}"])
    assert "serving /metrics on 127.0.0.1" in out
    assert not left.stdout.strip(), f"nodecheck serve outlived its container run: {left.stdout}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


# the capabilities buildah's chroot isolation gives a process: its `--cap-drop all` also drops what --cap-add names,
# so a securityContext's drop ALL + add is run as these minus the ones added
BUILDAH_DEFAULT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE",
                        "SYS_CHROOT", "SETFCAP", "AUDIT_WRITE", "MKNOD", "NET_RAW")


def as_in_the_pod(container: str, spec: dict, volume, *argv: str) -> list[str]:
    """buildah run as the DaemonSet's pod runs one of its containers: its user, the capabilities its securityContext
    keeps, its environment, and the state volume (`volume`, the host's directory) where it mounts it."""
    security = spec.get("securityContext", {})
    caps = security.get("capabilities", {})
    assert caps.get("drop") == ["ALL"], caps
    drops = [f"--cap-drop=CAP_{cap}" for cap in BUILDAH_DEFAULT_CAPS if cap not in caps.get("add", [])]
    env = [f"--env={e['name']}={e['value']}" for e in spec.get("env", []) if "value" in e]
    (mount,) = [m["mountPath"] for m in spec["volumeMounts"] if m["name"] == "state"]
    return ["buildah", "run", "--isolation", "chroot", f"--user={security['runAsUser']}:{security['runAsUser']}", *drops,
            *env, f"--volume={volume}:{mount}", container, "--", *argv]


@needs_builder
def test_the_daemonsets_state_outlives_its_pod(image, tmp_path):
    """The DaemonSet's state (acknowledgements of `nodecheck clear`) on the host's directory, as the kubelet makes it
    (root's, 0755): its init container, with CHOWN alone, gives it to the container's user, who writes the state;
    the next pod (a rollout) finds it and its init container passes again. In an emptyDir a rollout lost it."""
    pod = kubernetes_objects("daemonset.yaml")["DaemonSet"]["spec"]["template"]["spec"]
    (init,), (main,) = pod["initContainers"], pod["containers"]
    host_dir = tmp_path / "var-lib-nodecheck"
    host_dir.mkdir(mode=0o755)
    for pod_number in (1, 2):
        name = subprocess.run(["buildah", "from", image], capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        try:
            caps = subprocess.run(as_in_the_pod(name, init, host_dir, "grep", "CapEff", "/proc/self/status"),
                                  capture_output=True, text=True, timeout=120)
            assert caps.stdout.split() == ["CapEff:", "0000000000000001"], caps.stdout + caps.stderr  # CHOWN alone
            owned = subprocess.run(as_in_the_pod(name, init, host_dir, *init["command"]), capture_output=True, text=True, timeout=120)
            assert owned.returncode == 0, (pod_number, owned.stderr)
            ran = subprocess.run(as_in_the_pod(name, main, host_dir, "nodecheck", "inspect", "--json"), capture_output=True,
                                 text=True, timeout=120)
            assert ran.returncode == 0 and "cannot write nodecheck's state" not in ran.stderr, (pod_number, ran.stderr[-2000:])
        finally:
            subprocess.run(["buildah", "rm", name], capture_output=True, timeout=120)
        state = host_dir / "state.json"
        assert state.stat().st_uid == 65534 and host_dir.stat().st_uid == 65534
        if pod_number == 1:
            first = json.loads(state.read_text())
    assert json.loads(state.read_text())["boot_id"] == first["boot_id"]  # the same boot's file, found and kept
