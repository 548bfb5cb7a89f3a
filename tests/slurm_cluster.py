"""A real single-node Slurm (munge, slurmctld, slurmd) on localhost, after ../shared/recipes/slurm.sh,
with nodecheck's wrapper installed as Prolog and HealthCheckProgram through deploy/slurm's snippet.
Everything lives in one temporary directory, with free ports, a cluster name and a munged socket of
its own, so two suites on one machine never meet; the daemons are stopped on exit (munged last)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from helpers import free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "sinfo")


def missing() -> str | None:
    """Why this machine cannot run the harness, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd runs the prolog as root)"
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    return f"needs Slurm and munge (apt install slurm-wlm munge): {', '.join(absent)} missing" if absent else None


class SlurmNode:
    def __init__(self, health_interval: int = 3) -> None:
        # not under pytest's tmp_path: that is root-only (0700) and slurmctld runs as user slurm
        self.root = Path(tempfile.mkdtemp(prefix="nodecheck-slurm-"))
        self.name = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.nodecheck_config = self.root / "nodecheck.toml"
        self.health_interval = health_interval
        # a cluster of its own: another suite on this machine has other ports, another name and state
        self.cluster_name = f"nodecheck-{uuid.uuid4().hex[:8]}"
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.munge_socket = self.root / "munge" / "munge.socket"
        self._munged: subprocess.Popen | None = None

    def __enter__(self) -> "SlurmNode":
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True)
        self.root.chmod(0o755)
        shutil.chown(self.root / "state", "slurm", "slurm")
        shutil.chown(self.root / "log", "slurm", "slurm")
        self._start_munge()
        for mode in ("prolog", "healthcheck"):
            wrapper = self.root / f"nodecheck-{mode}"
            shutil.copy(REPO / "deploy/slurm/nodecheck-slurm", wrapper)
            wrapper.chmod(0o755)
        (self.root / "nodecheck.env").write_text(
            f"NODECHECK={Path(sys.executable).parent / 'nodecheck'}\nNODECHECK_CONFIG={self.nodecheck_config}\n"
            "NODECHECK_KILL_AFTER=60\n"
            # slurmd hands its scripts a fresh environment: the cluster's own state directory, not the machine's
            f"export STATE_DIRECTORY={self.root / 'nodecheck-state'}\n")
        self.configure("")
        snippet = (REPO / "deploy/slurm/slurm.conf.snippet").read_text().replace("/etc/slurm/", f"{self.root}/")
        snippet = re.sub(r"(?m)^HealthCheckInterval=\d+", f"HealthCheckInterval={self.health_interval}", snippet)
        self.conf.write_text(f"""ClusterName={self.cluster_name}
SlurmctldHost={self.name}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=slurm
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
{snippet}
NodeName={self.name} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=scratch Nodes=ALL MaxTime=INFINITE State=UP
""")
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([f"/usr/sbin/{daemon}"], env=self.env, check=True, timeout=30, capture_output=True)
        try:
            self.wait_for(lambda: self.node_state() == "idle", 90, "the node to come up idle")
        except TimeoutError as error:
            try:
                state = self.node_state()
            except subprocess.SubprocessError as failure:
                state = f"sinfo failed: {getattr(failure, 'stderr', '') or failure}"
            raise TimeoutError(f"{error} ({state!r}); slurmctld.log: {self.log('slurmctld.log')}\n"
                               f"slurmd.log: {self.log('slurmd.log')}") from None

    def _start_munge(self) -> None:
        """A munged of this harness's own, on a socket under its directory (slurm.conf's AuthInfo points
        there): another suite's munged, starting or stopping, can never be the one this cluster uses."""
        munge_dir = self.root / "munge"
        munge_dir.mkdir()
        shutil.chown(munge_dir, "munge", "munge")
        munge_dir.chmod(0o755)  # munged requires its socket directory to be searchable by all
        if not Path("/etc/munge/munge.key").is_file() or Path("/etc/munge/munge.key").stat().st_size == 0:
            subprocess.run(["runuser", "-u", "munge", "--", "mungekey", "--create"], check=True, timeout=30)
        self._munged = subprocess.Popen(
            ["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground", "--num-threads=10",
             f"--socket={self.munge_socket}", f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
             f"--seed-file={munge_dir}/munged.seed"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_for(lambda: self.munge_socket.exists(), 30, "munged's socket")

    def __exit__(self, *exc) -> None:
        for daemon in ("slurmd", "slurmctld"):
            pidfile = self.root / f"{daemon}.pid"
            try:
                pid = int(pidfile.read_text())
                os.kill(pid, signal.SIGTERM)
                self.wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 15, f"{daemon} to stop")
            except (OSError, ValueError, TimeoutError):
                pass
        self._kill_leftover_steps()
        if self._munged is not None:  # stopped last: slurmd and slurmctld talk through it until they exit
            subprocess.run(["pkill", "-f", "--", f"--socket={self.munge_socket}"], capture_output=True, timeout=10)
            try:
                self._munged.wait(15)
            except subprocess.TimeoutExpired:
                self._munged.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftover_steps(self) -> None:
        """A job's slurmstepd can outlive slurmd (one stayed for 40 minutes after a loaded run, its log deleted):
        every process started under this cluster's slurm.conf is killed, so the suite leaves the host as it was."""
        mine = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mine in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue

    def configure(self, text: str) -> None:
        """nodecheck's config for both wrappers; [slurm] conf points at this cluster (the health check's
        environment has no SLURM_CONF, and this slurm.conf is not in a standard place)."""
        self.nodecheck_config.write_text(f'{text}\n[slurm]\nconf = "{self.conf}"\n')

    # ---- asking Slurm -------------------------------------------------------------------------

    def run(self, *argv: str, timeout: float = 30) -> str:
        return subprocess.run(argv, env=self.env, check=True, capture_output=True, text=True, timeout=timeout).stdout

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-n", self.name, "-o", "%T").split("\n")[0].strip()  # a line per partition

    def node_reason(self) -> str:
        line = self.run("scontrol", "show", "node", self.name, "--oneliner")
        match = re.search(r"Reason=(.*?)(?: \[[^\]]*\])?\s*$", line)
        return match[1] if match else ""

    def job(self, job_id: str) -> dict[str, str]:
        line = self.run("scontrol", "show", "job", job_id, "--oneliner")
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def cancel(self, job_id: str) -> None:
        """scancel, ignoring a job that has already ended."""
        subprocess.run(["scancel", job_id], env=self.env, capture_output=True, timeout=30)

    def sbatch(self, *args: str) -> str:
        out = self.run("sbatch", "--parsable", "-N1", "-t", "1", *args)
        return out.strip().split(";")[0]

    @staticmethod
    def wait_for(condition, seconds: float, what: str):
        return wait_until(condition, seconds, what, pause=0.25, tolerate=(subprocess.SubprocessError,))

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""
