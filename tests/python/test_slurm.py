"""kiln-pretrain under a real Slurm (issue 44, point 4; docs/distributed.md, "Slurm").

A one-host cluster (munged, slurmctld, slurmd from Debian's packages) runs as this test's own
processes in a temporary folder (tests/python/slurm_cluster.py), on 127.0.0.1. Then:
- `srun -n 2 -c 1 kiln-pretrain`: two ranks over Gloo, rendezvous from Slurm's variables; each
  rank runs 1 intra-op thread (its --cpus-per-task) where LibTorch would take every core, and
  the run trains to the end;
- an sbatch job (the same two ranks) is preempted as a scheduler does it: `scancel --signal=TERM`
  during training (kiln saves a checkpoint and exits), `scontrol requeue`; the requeued script
  resumes from the newest checkpoint and finishes with the srun run's losses, bit for bit.
Every daemon and job process is ended by PID when the module's tests are done (also on failure),
and the test checks that none is left.
"""
import json
import os
import time
from pathlib import Path

import pytest

from slurm_cluster import Cluster, missing_programs

pytestmark = pytest.mark.skipif(bool(missing_programs()) or os.geteuid() != 0,
                                reason=f"needs root and Slurm's programs (missing: {missing_programs()}; "
                                       "scripts/setup.sh --tests installs them)")

STEPS = 120
ARGS = ["--device", "cpu", "--cutoff_len", "32", "--per_device_train_batch_size", "2", "--logging_steps", "1",
        "--eval_steps", "0", "--save_steps", "10", "--max_steps", str(STEPS), "--learning_rate", "1e-3",
        "--warmup_steps", "0", "--ddp_timeout", "120"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    c.start(timeout=60)
    yield c
    c.stop()
    assert c.leftovers() == [], "processes of the test cluster are still running"


def losses(out: Path):
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: h["loss"] for h in history if "loss" in h}


def wait_for(what, ready, timeout, cluster):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ready():
            return
        time.sleep(0.05)
    raise TimeoutError(f"no {what} after {timeout} s\n" + cluster.logs())


@pytest.fixture(scope="module")
def srun_run(cluster, kiln_bin):
    out = cluster.path("srun-out")
    res = cluster.run(["srun", "-n", 2, "-c", 1, "--kill-on-bad-exit=1", kiln_bin("kiln-pretrain"), *ARGS,
                       "--output_dir", out], check=False, timeout=300, cwd=cluster.root)
    assert res.returncode == 0, res.stderr[-3000:] + cluster.logs()
    return out, res


def test_srun_two_ranks_each_on_its_cpus(srun_run):
    out, res = srun_run
    assert sorted(losses(out)) == list(range(1, STEPS + 1))
    # Rank 0's banner: the job's two ranks; its CPU threads are its --cpus-per-task, not the host's.
    assert "Distributed = 2 processes (slurm, gloo; this is rank 0)" in res.stdout + res.stderr, res.stderr[-3000:]
    assert "CPU (1 threads)" in res.stdout + res.stderr, res.stderr[-3000:]


def test_sbatch_job_preempted_and_requeued_finishes_as_uninterrupted(cluster, kiln_bin, srun_run):
    out = cluster.path("job-out")
    script = cluster.path("job.sh")
    script.write_text(f"""#!/bin/bash
#SBATCH -n 2
#SBATCH -c 1
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH -o {cluster.path('job.log')}
resume=()
if compgen -G "{out}/checkpoint-*" > /dev/null; then resume=(--resume_from_checkpoint true); fi
exec srun --kill-on-bad-exit=1 {kiln_bin('kiln-pretrain')} {' '.join(ARGS)} --output_dir {out} "${{resume[@]}}"
""")
    job = cluster.run(["sbatch", "--parsable", script], cwd=cluster.root).stdout.strip().split(";")[0]
    # Preempted during training: after its first checkpoint, well before its last step.
    wait_for("first checkpoint", lambda: (out / "checkpoint-10").is_dir(), 120, cluster)
    cluster.run(["scancel", "--signal=TERM", job])
    wait_for("end of the preempted run", lambda: cluster.job_state(job) in ("COMPLETED", "FAILED", "CANCELLED"),
             120, cluster)
    assert cluster.job_state(job) == "COMPLETED", cluster.path("job.log").read_text()[-3000:]
    log = cluster.path("job.log").read_text()
    assert "SIGTERM received" in log, log[-3000:]
    saved = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert 10 <= saved < STEPS, saved
    # Requeued: the script runs again and resumes from the checkpoint the stop saved. slurmd refuses
    # a credential made in the same second as the one it revoked when the job ended ("Job
    # credential revoked"), so the requeued job is held until it can start 2 s later.
    cluster.run(["scontrol", "requeuehold", job])
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now+2"])
    cluster.run(["scontrol", "release", job])
    wait_for("the requeued job to finish", lambda: cluster.job_state(job) == "COMPLETED"
             and (out / f"checkpoint-{STEPS}").is_dir(), 300, cluster)
    log = cluster.path("job.log").read_text()
    assert f"checkpoint-{saved}" in log, log[-3000:]
    reference, _ = srun_run
    assert losses(out) == losses(reference)
