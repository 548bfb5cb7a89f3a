"""deploy/slurm's scripts against another user's links: `nodecheck-sweep` wrote a Report through a link planted at its
temporary name (a root-owned file was overwritten), and `nodecheck-allreduce` did the same with `$out.$$.tmp`. Each
now makes its temporary file with mktemp (created new, never opened through a link) and renames it into place (a
rename replaces a link, never writes through it), and the sweep refuses an output directory others may write.
srun and scontrol are stand-ins here (a real one-node Slurm runs the scripts in tests/system/test_slurm.py): srun runs the
task once, on this machine."""

import os
import socket
import subprocess
from pathlib import Path

from helpers import REPO, fake_executable

SRUN = 'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\nexec "$@"\n'


def stand_ins(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_executable(bin_dir / "srun", SRUN)
    fake_executable(bin_dir / "scontrol", 'case "$2" in hostnames) echo node1 ;; *) echo "NodeName=node1 NodeAddr=127.0.0.1 State=IDLE" ;; esac\n')
    report = '{"schema": "nodecheck.report", "schema_version": 1}'
    fake_executable(bin_dir / "nodecheck", f'case "$1" in inspect|bench) echo \'{report}\' ;; *) exit 0 ;; esac\n')
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "NODECHECK": str(bin_dir / "nodecheck"), "SLURM_JOB_NODELIST": "node1",
            "SLURM_JOB_ID": "7"}


def test_the_sweep_writes_through_no_planted_link(tmp_path):
    env = stand_ins(tmp_path)
    out = tmp_path / "sweep"
    out.mkdir(mode=0o755)
    host = socket.gethostname().split(".")[0]
    victim, other = tmp_path / "victim", tmp_path / "other"
    victim.write_text("root's file\n")
    other.write_text("another root file\n")
    (out / f".{host}.json.tmp").symlink_to(victim)  # the old temporary name
    (out / f"{host}.json").symlink_to(other)  # and the final one
    run = subprocess.run(["sh", str(REPO / "deploy/slurm/nodecheck-sweep"), str(out)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert victim.read_text() == "root's file\n" and other.read_text() == "another root file\n"
    final = out / f"{host}.json"
    assert not final.is_symlink() and '"nodecheck.report"' in final.read_text()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [f".{host}.json.tmp"]  # the plant alone


def test_the_sweep_refuses_a_directory_others_may_write(tmp_path):
    env = stand_ins(tmp_path)
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)
    run = subprocess.run(["sh", str(REPO / "deploy/slurm/nodecheck-sweep"), str(out)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "writable by others" in run.stderr and not list(out.iterdir())
    out.chmod(0o1777)  # sticky: no one may replace another's entry
    assert subprocess.run(["sh", str(REPO / "deploy/slurm/nodecheck-sweep"), str(out)], env=env, capture_output=True,
                          timeout=60).returncode == 0


def test_the_allreduce_writes_through_no_planted_link(tmp_path):
    env = stand_ins(tmp_path)
    out = tmp_path / "allreduce.json"
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    start = os.getpid()
    for pid in range(start, start + 400):  # the old name held the shell's pid: plant the next few hundred
        (tmp_path / f"allreduce.json.{pid}.tmp").symlink_to(victim)
    out.symlink_to(victim)
    run = subprocess.run(["sh", str(REPO / "deploy/slurm/nodecheck-allreduce"), str(out)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert victim.read_text() == "root's file\n"
    assert not out.is_symlink() and '"nodecheck.report"' in out.read_text()
    assert not list(tmp_path.glob(".nodecheck-allreduce.*"))
