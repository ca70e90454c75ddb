"""A one-host Slurm cluster that a test starts as its own processes in a temporary folder.

munged (its own key and socket), slurmctld and slurmd (the Debian packages slurmctld, slurmd,
slurm-client, munge; scripts/setup.sh --tests installs them) run in the foreground as children
of the test on 127.0.0.1, with free ports, their state, spool, logs and pid files in the folder,
and a slurm.conf that the client commands (srun, sbatch, squeue, scancel, scontrol) find through
SLURM_CONF. Nothing of the machine's own Slurm or munge configuration is read or touched.
stop() ends the daemons by the PIDs this object started (SIGTERM, then SIGKILL after a bound) and
waits for them; the jobs' processes are slurmd's children and go with it.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scancel", "scontrol", "sinfo")


def _find(name: str) -> str | None:
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return shutil.which(name)


def missing_programs() -> list[str]:
    return [name for name in DAEMONS if _find(name) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path, cpus: int | None = None):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # munged refuses a socket folder others can write to
        self.procs: list[subprocess.Popen] = []
        self.host = socket.gethostname()
        self.cpus = cpus or os.cpu_count() or 1
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        for var in [k for k in self.env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del self.env[var]  # a test run inside a job must not hand its job's variables on

    def path(self, name: str) -> Path:
        return self.root / name

    def start(self, timeout: float = 60) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        key = self.path("munge.key")
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._spawn([_find("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={self.socket}",
                     f"--pid-file={self.path('munged.pid')}", f"--log-file={self.path('munged.log')}",
                     f"--seed-file={self.path('munged.seed')}"], "munged.out")
        self._wait(lambda: self.socket.exists(), timeout, "munged's socket")
        for d in ("state", "spool"):
            self.path(d).mkdir(exist_ok=True)
        ctld_port, slurmd_port = _free_port(), _free_port()
        self.conf.write_text("\n".join([
            "ClusterName=kilntest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool')}",
            f"SlurmctldPidFile={self.path('slurmctld.pid')}",
            f"SlurmdPidFile={self.path('slurmd.pid')}",
            f"SlurmctldLogFile={self.path('slurmctld.log')}",
            f"SlurmdLogFile={self.path('slurmd.log')}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",  # a job whose begin time passed starts within a second
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobRequeue=1",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        self._spawn([_find("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        self._spawn([_find("slurmd"), "-D", "-f", str(self.conf), "-N", self.host], "slurmd.out")

        def idle():
            res = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=10)
            return res.returncode == 0 and res.stdout.strip() in ("idle", "idle*") and "*" not in res.stdout

        self._wait(idle, timeout, "the node to be idle")

    def _spawn(self, cmd, out_name: str) -> None:
        out = open(self.path(out_name), "wb")
        self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))
        out.close()

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}:\n"
                                       + self.logs())
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"no {what} after {timeout} s:\n" + self.logs())

    def logs(self) -> str:
        parts = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            p = self.path(name)
            if p.exists():
                parts.append(f"--- {name}\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def run(self, cmd, check=True, timeout=60, **kw) -> subprocess.CompletedProcess:
        res = subprocess.run([_find(cmd[0]), *map(str, cmd[1:])], capture_output=True, text=True, env=self.env,
                             timeout=timeout, **kw)
        if check and res.returncode != 0:
            raise RuntimeError(f"{cmd} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}\n" + self.logs())
        return res

    def job_state(self, job: str) -> str:
        res = self.run(["scontrol", "show", "job", job], check=False, timeout=10)
        for field in res.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def leftovers(self) -> list[int]:
        """Processes of this cluster still running: the jobs' tasks carry this cluster's SLURM_CONF
        in their environment; slurmstepd (which detaches from slurmd and clears its environment)
        holds a Unix socket in this cluster's spool folder, as the daemons hold theirs."""
        mark = f"SLURM_CONF={self.conf}".encode()
        ours = set()
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                fields = line.split()
                if len(fields) >= 8 and fields[7].startswith(str(self.root)):
                    ours.add(f"socket:[{fields[6]}]")
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
                    continue
                if ours and any(os.readlink(fd) in ours for fd in (entry / "fd").iterdir()):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def stop(self) -> None:
        """slurmd first (it ends its jobs' steps), then slurmctld, then munged, each by its PID; then
        what is left of the jobs (slurmstepd and its tasks), by PID, after a bound."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)  # its own session: what it started goes too
                    p.wait(timeout=15)
        self.procs = []
        deadline = time.time() + 20
        while self.leftovers() and time.time() < deadline:
            time.sleep(0.2)
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
