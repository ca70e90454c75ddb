"""Data-parallel training on c10d/Gloo with several real processes on 127.0.0.1 (docs/distributed.md).

The launchers are the ones users run: the venv's torchrun (--no-python) and a Slurm-style launch
with the variables set by hand. Every process is bounded by a timeout (and BASE's ddp_timeout, so
a hung worker ends on its own) and killed if the test fails: torchrun runs in its own process
group, killed whole, so its workers are never orphaned. The reference is one process training on the same examples (batch N*b): the
parameters after every step must be bitwise identical on all ranks and equal to it within fp32
rounding, for ZeRO stages 0, 1 and 2, with and without gradient accumulation.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS = 4
# The tiny preset on the embedded corpus: 475,776 parameters, several buckets of 0.5 MB.
# adam_epsilon 1e-4 (gradients here are ~1e-4..1e-2) makes each update depend on the gradients'
# scale, which Adam otherwise cancels: a wrong token normalisation or clipping norm must show.
BASE = ["--cutoff_len", "32", "--logging_steps", "1", "--eval_steps", "0", "--save_steps", "0",
        "--learning_rate", "1e-3", "--warmup_steps", "0", "--ddp_bucket_cap_mb", "1", "--max_grad_norm", "0.5",
        "--adam_epsilon", "1e-4", "--ddp_timeout", "120"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_torchrun(kiln_bin, program, nproc, *args):
    """torchrun in a session of its own; kill_torchrun() ends it and every worker it started."""
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), "--no-python", str(kiln_bin(program)),
           *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def descendants(pid: int):
    """The processes below `pid`, from /proc (field 4 of /proc/P/stat is the parent)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        found += children
        frontier = children
    return found


def kill_torchrun(proc):
    """Kills torchrun's process group and then its workers, which torchrun starts each in a session
    of their own (so killing its group alone would orphan them). Only while torchrun is unreaped:
    until then its pid and its workers' cannot be reused."""
    workers = descendants(proc.pid)
    for target in (proc.pid, *workers):
        try:
            os.killpg(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate()


def torchrun(kiln_bin, program, nproc, *args, timeout=300):
    proc = start_torchrun(kiln_bin, program, nproc, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # a timeout or an interrupt: never leave the workers running
        kill_torchrun(proc)
        raise
    assert proc.returncode == 0, err[-4000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def single(kiln_bin, program, *args, timeout=300):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run([str(kiln_bin(program)), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                         env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def dumps(folder: Path, step: int, world: int):
    return [np.fromfile(folder / f"step{step}_rank{r}.bin", dtype=np.float32) for r in range(world)]


def logged(run_dir: Path):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return np.array([(m["loss"], m["grad_norm"]) for m in lines if "loss" in m])


def figures(stdout: str):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{\"rank\"")]


@pytest.fixture(scope="module")
def reference(kiln_bin, tmp_path_factory):
    """One process, batch N*b, for each (N*b, accumulation) the parity cases use."""
    cache = {}

    def get(batch: int, accumulation: int) -> Path:
        key = (batch, accumulation)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"ref_b{batch}_ga{accumulation}")
            single(kiln_bin, "kiln-dist-worker", "--dump-dir", out, *BASE, "--max_steps", STEPS,
                   "--per_device_train_batch_size", batch, "--gradient_accumulation_steps", accumulation,
                   "--output_dir", out / "run")
            cache[key] = out
        return cache[key]

    return get


CASES = [  # (world, batch per rank, accumulation, zero_stage)
    (2, 2, 1, 0), (2, 2, 2, 0), (2, 2, 1, 1), (2, 2, 2, 1), (2, 2, 1, 2), (2, 2, 2, 2),
    (4, 1, 1, 0), (4, 1, 2, 1), (4, 1, 2, 2),
]


@pytest.mark.parametrize("world,batch,accumulation,stage", CASES)
def test_ranks_agree_bitwise_and_equal_one_process(kiln_bin, reference, tmp_path, world, batch, accumulation, stage):
    res = torchrun(kiln_bin, "kiln-dist-worker", world, "--dump-dir", tmp_path, *BASE, "--max_steps", STEPS,
                   "--per_device_train_batch_size", batch, "--gradient_accumulation_steps", accumulation,
                   "--zero_stage", stage, "--output_dir", tmp_path / "run")
    ref = reference(world * batch, accumulation)
    # The loss and the clipping norm are the one-process ones (global token count, global norm).
    got, want = logged(tmp_path / "run"), logged(ref / "run")
    assert got.shape == (STEPS, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for step in range(1, STEPS + 1):
        ranks = dumps(tmp_path, step, world)
        for r in range(1, world):
            assert np.array_equal(ranks[0], ranks[r]), f"step {step}: rank {r} differs from rank 0"
        want = np.fromfile(ref / f"step{step}_rank0.bin", dtype=np.float32)
        moved = np.linalg.norm(want - np.fromfile(ref / "step1_rank0.bin", dtype=np.float32)) if step > 1 else 1.0
        assert moved > 0
        rel = np.linalg.norm(ranks[0] - want) / np.linalg.norm(want)
        assert rel < 1e-6, f"step {step}: relative distance {rel:.2e} from one process with batch {world * batch}"
    figs = figures(res.stdout)
    assert len(figs) == world
    # Buckets went out while backward was still producing gradients (stage 2 reduces every
    # micro-batch, stages 0 and 1 only the last); the --no-overlap half of
    # test_buckets_are_reduced_during_backward_unless_no_overlap shows the count is not vacuous.
    reducing = STEPS * (accumulation if stage == 2 else 1)
    for fig in figs:
        assert fig["buckets"] >= 2
        assert fig["buckets_launched"] == reducing * fig["buckets"], fig
        assert fig["buckets_overlapped"] > 0, fig


def test_buckets_are_reduced_during_backward_unless_no_overlap(kiln_bin, tmp_path):
    """A bucket counts as overlapped when it was launched while the same backward still had
    gradients to produce (dist::LaunchCounts, in kiln-profile's JSON). With overlap that is every
    bucket but the one the last gradient completes; with --no-overlap (every bucket launched in
    end_backward()) none, so a synchronisation that waited for the end of backward fails here."""
    # tiny widened to 3.3M parameters: 9 buckets of 1 MB (the smallest cap) where tiny has 2.
    tiny = (Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny.yaml").read_text()
    wide = tmp_path / "tiny-wide.yaml"
    wide.write_text(tiny.replace("name: tiny", "name: tiny-wide").replace("hidden_size: 128", "hidden_size: 256")
                    .replace("intermediate_size: 384", "intermediate_size: 768")
                    .replace("num_hidden_layers: 2", "num_hidden_layers: 4"))
    counts = {}
    for overlap in (True, False):
        out = tmp_path / f"overlap_{overlap}"
        torchrun(kiln_bin, "kiln-profile", 2, "sweep", "--model", wide, "--cutoff-len", 32, "--batch-size", 1,
                 "--dtype", "fp32", "--steps", 2, "--warmup", 0, "--ddp-bucket-cap-mb", 1,
                 *([] if overlap else ["--no-overlap"]), "--format", "json", "--output", out)
        report = json.loads((out / "profile.json").read_text())
        assert report["ddp_overlap"] == overlap
        (row,) = report["rows"]
        assert row["status"] == "ok", row["message"]
        counts[overlap] = (row["buckets_launched"], row["buckets_overlapped"])
    launched, overlapped = counts[True]
    assert launched >= 2 * 8, counts  # several buckets in each of the 2 steps
    assert overlapped == launched - 2, counts  # all but the one the last gradient completes, per step
    assert counts[False] == (launched, 0), counts


def test_optimizer_state_and_gradients_per_rank_are_one_nth(kiln_bin, tmp_path):
    per_stage = {}
    for stage in (0, 1, 2):
        res = torchrun(kiln_bin, "kiln-dist-worker", 2, *BASE, "--max_steps", 1, "--per_device_train_batch_size", 1,
                       "--zero_stage", stage, "--output_dir", tmp_path / f"s{stage}")
        per_stage[stage] = figures(res.stdout)
    full_state = per_stage[0][0]["optimizer_state_bytes"]
    full_grads = per_stage[0][0]["grad_bytes"]
    assert full_grads >= 475_776 * 4  # every gradient, in the flat buffer
    for stage in (1, 2):
        for fig in per_stage[stage]:
            # exp_avg + exp_avg_sq of half the elements; each slice also has its 4-byte step counter.
            assert abs(fig["optimizer_state_bytes"] - full_state / 2) < 0.01 * full_state, (stage, fig)
    for fig in per_stage[1]:
        assert fig["grad_bytes"] == full_grads
    for fig in per_stage[2]:
        assert fig["grad_bytes"] == full_grads // 2


def losses(ckpt: Path):
    history = json.loads((ckpt / "trainer_state.json").read_text())["log_history"]
    return [(h["step"], h["loss"], h["grad_norm"]) for h in history if "loss" in h]


def check_hf_optimizer_file(ckpt: Path):
    """transformers' optimizer.pt (rank 0 writes it, ZeRO's chunks gathered) holds exactly the state
    kiln keeps in its own files (one per rank under ZeRO: "<param>[begin:end].exp_avg" slices)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file
    slices = {}
    for f in ckpt.glob("optimizer*.safetensors"):
        for key, t in load_file(str(f)).items():
            m = re.fullmatch(r"(.+?)(?:\[(\d+):(\d+)\])?\.(exp_avg|exp_avg_sq|step)", key)
            if m:
                slices.setdefault((m[1], m[4]), []).append((int(m[2] or 0), t))
    hf = torch.load(ckpt / "optimizer.pt", weights_only=True)
    params = dict(transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).named_parameters())
    order = [n for n, p in params.items() if p.dim() > 1] + [n for n, p in params.items() if p.dim() <= 1]
    assert [len(g["params"]) for g in hf["param_groups"]] == [sum(p.dim() > 1 for p in params.values()),
                                                              sum(p.dim() <= 1 for p in params.values())]
    for i, name in enumerate(order):
        for key in ("exp_avg", "exp_avg_sq"):
            parts = [t.flatten() for _, t in sorted(slices[(name, key)], key=lambda x: x[0])]
            assert torch.equal(hf["state"][i][key], torch.cat(parts).view(params[name].shape)), (name, key)
        assert all(t.item() == hf["state"][i]["step"].item() for _, t in slices[(name, "step")])


@pytest.mark.parametrize("stage", [0, 2])
def test_checkpoint_and_resume_with_two_ranks_is_exact(kiln_bin, tmp_path, stage):
    args = [*BASE, "--per_device_train_batch_size", 2, "--zero_stage", stage, "--save_steps", 3]
    straight = tmp_path / "straight"
    torchrun(kiln_bin, "kiln-pretrain", 2, *args, "--max_steps", 6, "--output_dir", straight)
    ckpt = straight / "checkpoint-3"
    names = {p.name for p in ckpt.iterdir()}
    assert {"config.json", "model.safetensors", "trainer_state.json", "rng_state_0.safetensors",
            "rng_state_1.safetensors"} <= names
    if stage:
        assert {"optimizer.rank-00000-of-00002.safetensors", "optimizer.rank-00001-of-00002.safetensors"} <= names
    else:
        assert "optimizer.safetensors" in names
    check_hf_optimizer_file(ckpt)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    subprocess.run(["cp", "-r", str(ckpt), str(resumed)], check=True)
    torchrun(kiln_bin, "kiln-pretrain", 2, *args, "--max_steps", 6, "--output_dir", resumed,
             "--resume_from_checkpoint", resumed / "checkpoint-3")
    assert losses(resumed / "checkpoint-6") == losses(straight / "checkpoint-6")
    # Another world size is refused with one clear line.
    res = subprocess.run([str(kiln_bin("kiln-pretrain")), *map(str, args), "--max_steps", "6", "--output_dir",
                          str(tmp_path / "other"), "--resume_from_checkpoint", str(ckpt)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "written by 2 processes" in res.stderr and "same world size" in res.stderr


def test_banner_counts_the_world_and_only_rank_0_prints(kiln_bin, tmp_path):
    res = torchrun(kiln_bin, "kiln-pretrain", 2, *BASE, "--max_steps", 2, "--per_device_train_batch_size", 3,
                   "--gradient_accumulation_steps", 2, "--output_dir", tmp_path / "run")
    assert res.stdout.count("***** Running training *****") == 1
    assert "Total train batch size (w. parallel, distributed & accumulation) = 12" in res.stdout
    assert "Distributed = 2 processes (torchrun, gloo" in res.stdout
    assert res.stderr.count("{'loss':") == 2  # rank 0's two log lines only
    # The banner of a real launch (max_steps > 0, 2 processes) is HF's too.
    banner = {k: v.replace(",", "") for k, v in
              (line.strip().split(" = ", 1) for line in res.stdout.splitlines() if " = " in line)}
    batches = -(-int(banner["Num examples"]) // (3 * 2))  # rank 0's DistributedSampler share, in batches of 3
    assert (int(banner["Num Epochs"]), int(banner["Total optimization steps"])) == \
        tuple(hf_445_banner(batches, 3, 2, 2, 3.0, 2)[i] for i in (0, 2))


def slurm_launch(kiln_bin, world, args, port, extra_env=None):
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "TORCHELASTIC"))}
        env.update({"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": str(world),
                    "SLURM_TASKS_PER_NODE": f"{world}", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "4242",
                    "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **(extra_env or {})})
        procs.append(subprocess.Popen([str(kiln_bin("kiln-pretrain")), *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def reap(procs, timeout):
    """Waits for every process (killing what is left at the deadline); returns (rc, stderr, seconds) each."""
    out, start = [], time.time()
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, timeout - (time.time() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        out.append((p.returncode, err, time.time() - start))
    return out


def wait_for(path: Path, deadline_s: float):
    end = time.time() + deadline_s
    while not path.exists() and time.time() < end:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def test_kill_9_of_one_rank_ends_the_others_within_the_timeout(kiln_bin, tmp_path):
    out = tmp_path / "run"
    args = [*BASE, "--per_device_train_batch_size", 2, "--max_steps", 100000, "--save_steps", 2, "--zero_stage", 1,
            "--ddp_timeout", 20, "--output_dir", out]
    procs = slurm_launch(kiln_bin, 2, args, free_port())
    try:
        wait_for(out / "checkpoint-4" / "trainer_state.json", 120)
        # Aim at a save in progress (rank 1 writing its part into .checkpoint-N.tmp), the hard case.
        end = time.time() + 20
        while time.time() < end and not any(n.endswith(".tmp") and n != ".checkpoint-4.tmp" for n in os.listdir(out)):
            time.sleep(0.001)
        procs[1].kill()
        killed = time.time()
        results = reap(procs, 60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    rc, err, _ = results[0]
    assert rc not in (0, None), err
    assert time.time() - killed < 25, "rank 0 outlived the ddp_timeout of 20 s"
    last = err.strip().splitlines()[-1]
    assert "[rank 0] error" in last and "failed" in last, err[-2000:]
    # The newest complete checkpoint is intact and resumable; no half-written one kept its name.
    complete = sorted((p for p in out.glob("checkpoint-*")), key=lambda p: int(p.name.split("-")[1]))
    assert complete
    for ckpt in complete:
        names = {p.name for p in ckpt.iterdir()}
        assert {"model.safetensors", "trainer_state.json", "optimizer.rank-00000-of-00002.safetensors",
                "optimizer.rank-00001-of-00002.safetensors"} <= names, (ckpt, names)
    # A fresh launch resuming as HF does (resume_from_checkpoint: true, the newest checkpoint-N)
    # starts from the newest complete checkpoint, never from what the save that was cut left
    # behind (the start removes it), and trains on from there.
    newest = int(complete[-1].name.split("-")[1])
    before = json.loads((complete[-1] / "trainer_state.json").read_text())["log_history"]
    left = [n for n in os.listdir(out) if n.startswith(".checkpoint-")]
    res = torchrun(kiln_bin, "kiln-pretrain", 2, *args, "--max_steps", newest + 2, "--resume_from_checkpoint", "true")
    assert not [n for n in os.listdir(out) if n.startswith(".checkpoint-")], os.listdir(out)
    if left:
        assert "cleaned up" in res.stderr, (left, res.stderr[-2000:])
    state = json.loads((out / f"checkpoint-{newest + 2}" / "trainer_state.json").read_text())
    assert state["global_step"] == newest + 2
    steps = [h["step"] for h in state["log_history"] if "loss" in h]
    assert steps == list(range(1, newest + 3)), steps
    assert state["log_history"][:len(before)] == before


def test_a_hung_rank_ends_the_others_after_ddp_timeout(kiln_bin, tmp_path):
    out = tmp_path / "run"
    args = [*BASE, "--per_device_train_batch_size", 2, "--max_steps", 100000, "--save_steps", 0, "--ddp_timeout", 5,
            "--output_dir", out]
    procs = slurm_launch(kiln_bin, 2, args, free_port())
    try:
        wait_for(out / "metrics.jsonl", 120)
        procs[1].send_signal(signal.SIGSTOP)  # alive but silent: only the timeout can tell
        stopped = time.time()
        rc, err, _ = reap(procs[:1], 60)[0]
        waited = time.time() - stopped
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rc == 2, err[-2000:]
    assert 4 < waited < 30, f"rank 0 gave up after {waited:.1f} s with ddp_timeout 5"
    assert "[rank 0] error" in err and "failed" in err, err[-2000:]


@pytest.mark.parametrize("victim", [1, 0])
def test_kill_9_of_one_rank_during_a_step_ends_the_other_at_once(kiln_bin, tmp_path, victim):
    """SIGKILL of one rank in the middle of training (no save in progress; rank 0 hosts the store,
    so victim 0 takes it down too): the survivor's next collective fails on the closed connections,
    long before ddp_timeout (60 s here), and it exits 2 by itself with one line naming the
    collective, its rank and the peer's address; nothing is left running."""
    out = tmp_path / "run"
    args = [*BASE, "--per_device_train_batch_size", 2, "--max_steps", 100000, "--save_steps", 0, "--zero_stage", 2,
            "--ddp_timeout", 60, "--output_dir", out]
    procs = slurm_launch(kiln_bin, 2, args, free_port())
    survivor = 1 - victim
    try:
        wait_for(out / "metrics.jsonl", 120)
        time.sleep(1.0)  # a few steps in: between, or inside, a step's collectives
        procs[victim].kill()
        killed = time.time()
        rc, err, _ = reap(procs[survivor:survivor + 1], 60)[0]
        waited = time.time() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rc == 2, err[-2000:]
    assert waited < 20, f"rank {survivor} took {waited:.1f} s to see a killed rank (ddp_timeout 60)"
    last = err.strip().splitlines()[-1]
    assert f"kiln-pretrain: [rank {survivor}] error: " in last and f"(rank {survivor} of 2) failed" in last, last
    assert re.search(r"(all_reduce|reduce_scatter|all_gather|broadcast|barrier)", last), last
    assert re.search(r"(Connection (reset|closed) by peer|Read error|Broken pipe).*127\.0\.0\.1|127\.0\.0\.1.*"
                     r"(Connection (reset|closed) by peer|Broken pipe)", last), last
    assert all(p.poll() is not None for p in procs)


def test_a_normal_two_rank_run_shuts_the_groups_down_quietly(kiln_bin, tmp_path):
    """Both ranks reach the end, shut their groups down in order (Comm::shutdown) and exit 0 with
    nothing from c10d on stderr: no warning about a process group left to its destructor, no
    connection error from a rank whose peer closed first."""
    res = torchrun(kiln_bin, "kiln-pretrain", 2, *BASE, "--max_steps", 3, "--per_device_train_batch_size", 1,
                   "--output_dir", tmp_path / "run")
    assert "kiln-pretrain: finished at step 3" in res.stdout
    noise = [line for line in res.stderr.splitlines()
             if re.search(r"destroy_process_group|ProcessGroup|c10d|gloo|Connection|\[W\d{4}", line)]
    assert not noise, noise


def test_sigterm_to_one_rank_makes_every_rank_save_the_same_checkpoint(kiln_bin, tmp_path):
    out = tmp_path / "run"
    args = [*BASE, "--per_device_train_batch_size", 2, "--max_steps", 100000, "--save_steps", 0,
            "--ddp_timeout", 60, "--output_dir", out]
    procs = slurm_launch(kiln_bin, 2, args, free_port())
    try:
        wait_for(out / "metrics.jsonl", 120)
        time.sleep(1.0)
        procs[1].send_signal(signal.SIGTERM)  # srun delivers to all tasks; one is the harder case
        results = reap(procs, 60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rc, err, _ in results:
        assert rc == 0, err[-2000:]
    assert "a stop request (of another rank)" in results[0][1]
    ckpts = list(out.glob("checkpoint-*"))
    assert len(ckpts) == 1
    state = json.loads((ckpts[0] / "trainer_state.json").read_text())
    assert state["global_step"] == int(ckpts[0].name.split("-")[1])
    assert json.loads((ckpts[0] / "kiln_state.json").read_text())["world_size"] == 2


def test_sigterm_to_torchrun_makes_every_rank_save_the_same_checkpoint(kiln_bin, tmp_path):
    """torchrun forwards a SIGTERM it receives to every worker (then exits non-zero itself, as its
    agent does): every rank writes its part of one checkpoint, rank 0 reports the interruption
    (its normal exit path) and no rank reports an error."""
    out = tmp_path / "run"
    proc = start_torchrun(kiln_bin, "kiln-pretrain", 2, *BASE, "--per_device_train_batch_size", 2, "--max_steps",
                          100000, "--zero_stage", 1, "--output_dir", out)
    try:
        wait_for(out / "metrics.jsonl", 120)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=90)
    except BaseException:
        kill_torchrun(proc)
        raise
    (ckpt,) = [p for p in out.iterdir() if p.name.startswith("checkpoint-")]
    step = int(ckpt.name.split("-")[1])
    assert json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == step
    assert {"rng_state_0.safetensors", "rng_state_1.safetensors", "optimizer.rank-00000-of-00002.safetensors",
            "optimizer.rank-00001-of-00002.safetensors"} <= {p.name for p in ckpt.iterdir()}
    assert f"kiln-pretrain: interrupted at step {step}" in stdout, stdout[-2000:] + stderr[-2000:]
    assert not re.search(r"kiln-pretrain: (\[rank \d+\] )?error", stderr), stderr[-2000:]  # torchrun's own traceback aside
    assert not [n for n in os.listdir(out) if n.startswith(".checkpoint-")]


def test_llama_factory_ddp_timeout_of_180000000_s_is_accepted(kiln_bin, tmp_path):
    """LLaMA-Factory's examples set ddp_timeout: 180000000 (5.7 years): every collective's and the
    rendezvous' timeout must take it without overflowing into an immediate one."""
    res = torchrun(kiln_bin, "kiln-pretrain", 2, *BASE, "--ddp_timeout", 180000000, "--max_steps", 2,
                   "--per_device_train_batch_size", 1, "--output_dir", tmp_path / "run")
    assert "kiln-pretrain: finished at step 2" in res.stdout, res.stdout[-2000:]


def hf_445_banner(len_dataloader, batch, accumulation, world, epochs, max_steps):
    """Trainer._inner_training_loop of transformers 4.45 (the version of the banners in configs/reference/llamafactory_runs.yaml), transcribed:
    (Num Epochs, total train batch size, total optimization steps, updates per epoch)."""
    import math

    updates = max(len_dataloader // accumulation, 1)
    if max_steps > 0:
        return max_steps // updates + int(max_steps % updates > 0), batch * accumulation * world, max_steps, updates
    return math.ceil(epochs), batch * accumulation * world, math.ceil(epochs * updates), updates


def hf_installed_banner(dataloader, batch, accumulation, world, epochs, max_steps):
    """The same numbers from the installed transformers' own Trainer.set_initial_training_values,
    called on a stand-in for the Trainer that has what it reads (no model, no parallelism config)."""
    from types import SimpleNamespace

    from transformers.trainer import Trainer

    class Stub:
        _train_batch_size = batch
        model = None
        is_deepspeed_enabled = False
        accelerator = SimpleNamespace(parallelism_config=None)
        args = SimpleNamespace(per_device_train_batch_size=batch)
        get_total_train_batch_size = Trainer.get_total_train_batch_size
        get_tp_size = Trainer.get_tp_size
        get_cp_size = Trainer.get_cp_size
        get_sp_size = Trainer.get_sp_size
        num_examples = Trainer.num_examples

    args = SimpleNamespace(max_steps=max_steps, gradient_accumulation_steps=accumulation, num_train_epochs=epochs,
                           world_size=world, per_device_train_batch_size=batch)
    epochs_, updates, examples, _, total_batch, _, steps = Trainer.set_initial_training_values(Stub(), args, dataloader)
    return epochs_, total_batch, steps, updates, examples


BANNER_CASES = [  # (cutoff_len, world, batch per rank, accumulation, num_train_epochs, max_steps)
    (64, 2, 3, 2, 2, -1), (64, 4, 1, 8, 1, -1), (64, 3, 5, 1, 3, -1), (128, 2, 4, 3, 2.5, -1),
    (256, 8, 16, 4, 1, -1), (512, 6, 64, 8, 2, -1),  # fewer batches than accumulation steps: one update
    (32, 2, 8, 4, 3, 50), (128, 4, 2, 3, 1, 1000), (256, 3, 7, 2, 1, 10),  # max_steps > 0 with world > 1
]


def test_banner_arithmetic_with_world_size_is_hf_trainers(kiln_bin, tmp_path):
    """kiln's banner against HF Trainer's numbers for the same (examples, batch, accumulation, world,
    epochs, max_steps): the dataloader's length from torch's own DistributedSampler and DataLoader
    (rank 0's share), then the installed transformers' own Trainer.set_initial_training_values
    (5.x, as LLaMA-Factory 0.9.5 requires), which kiln must equal; transformers 4.45's arithmetic
    (the users' logs) agrees where the dataloader's length is a multiple of the accumulation or
    below it, and otherwise counts exactly one update per epoch fewer (docs/distributed.md). The
    examples differ from case to case (cutoff_len packs the corpus into more or fewer blocks). Each
    case is rank 0's --dry-run under a torchrun environment: a dry run joins no process group."""
    from torch.utils.data import DataLoader, DistributedSampler

    seen = set()
    for case in BANNER_CASES:
        cutoff, world, batch, accumulation, epochs, max_steps = case
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
        env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"})
        res = subprocess.run([str(kiln_bin("kiln-pretrain")), "--dry-run", *map(str, [
            "--cutoff_len", cutoff, "--per_device_train_batch_size", batch, "--gradient_accumulation_steps",
            accumulation, "--num_train_epochs", epochs, "--max_steps", max_steps, "--output_dir", tmp_path / "run"])],
            capture_output=True, text=True, timeout=120, env=env)
        assert res.returncode == 0, (case, res.stderr[-2000:])
        banner = {k: v.replace(",", "") for k, v in
                  (line.strip().split(" = ", 1) for line in res.stdout.splitlines() if " = " in line)}
        examples = int(banner["Num examples"])
        seen.add(examples)
        dataset = range(examples)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=0, shuffle=True, drop_last=False)
        loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
        got = (int(banner["Num Epochs"]), int(banner["Total train batch size (w. parallel, distributed & accumulation)"]),
               int(banner["Total optimization steps"]), int(banner["Num update steps per epoch"]))
        installed = hf_installed_banner(loader, batch, accumulation, world, epochs, max_steps)
        assert installed[4] == examples, (case, installed)
        assert got == installed[:4], (case, examples, len(loader), got, installed)
        old = hf_445_banner(len(loader), batch, accumulation, world, epochs, max_steps)
        if len(loader) % accumulation == 0 or len(loader) < accumulation:
            assert old == got, (case, examples, len(loader), old, got)
        else:  # the users' logs: the last, shorter window was not a step
            assert old[3] + 1 == got[3], (case, examples, len(loader), old, got)
    assert len(seen) >= 4, seen


def test_profile_under_torchrun_predicts_each_stages_memory_per_rank(kiln_bin, tmp_path):
    for stage in (0, 1, 2):
        out = tmp_path / f"s{stage}"
        torchrun(kiln_bin, "kiln-profile", 2, "sweep", "--model", "tiny", "--cutoff-len", "64,256", "--batch-size", 2,
                 "--dtype", "fp32", "--steps", 2, "--warmup", 1, "--zero-stage", stage, "--ddp-bucket-cap-mb", 1,
                 "--format", "json", "--output", out)
        report = json.loads((out / "profile.json").read_text())
        assert report["world_size"] == 2 and report["zero_stage"] == stage and report["backend"] == "gloo"
        for row in report["rows"]:
            assert row["status"] == "ok", row["message"]
            assert 0.85 < row["measured_over_predicted"] < 1.15, (stage, row["cutoff_len"], row["measured_over_predicted"])
            assert 0 < row["comm_wait_share"] < 1
            assert "gradient buffer (data parallel)" in row["predicted_components"]


def test_counter_phases_under_torchrun_wrap_the_data_parallel_hooks(kiln_bin, tmp_path):
    # --counter-phases marks backward at the step's before/after_backward hooks, which data
    # parallelism uses too (arming and draining the gradient buckets): both must still run, and the
    # phases must still partition the counted steps.
    out = tmp_path / "phases"
    torchrun(kiln_bin, "kiln-profile", 2, "sweep", "--model", "tiny", "--cutoff-len", 32, "--batch-size", 1,
             "--grad-accum", 2, "--dtype", "fp32", "--steps", 1, "--warmup", 0, "--ddp-bucket-cap-mb", 1,
             "--counter-phases", "--counter-steps", 1, "--format", "json", "--output", out)
    report = json.loads((out / "profile.json").read_text())
    row = report["rows"][0]
    assert report["world_size"] == 2 and row["status"] == "ok", row["message"]
    assert row["buckets_launched"] > 0  # the hooks still reduce the gradients
    counters = row["counters"]
    if counters is None:
        assert report["counters"].startswith("counters unavailable: ")
        return
    phases = counters["phases"]
    assert [(p["name"], p["segments"]) for p in phases] == [("forward", 2), ("backward", 2), ("optimizer", 1)]
    if counters["cpu_seconds"] is not None:
        assert sum(p["cpu_seconds"] for p in phases) == pytest.approx(counters["cpu_seconds"], rel=1e-9)


def test_comm_benchmark_reports_nccl_tests_bus_bandwidth(kiln_bin, tmp_path):
    out = tmp_path / "comm.json"
    res = torchrun(kiln_bin, "kiln-bench", 2, "--ops", "comm", "--iters", 2, "--comm-max-bytes", 4 << 20,
                   "--json", out)
    assert res.stdout.count("collectives on the gloo group, 2 ranks") == 1  # rank 0 reports
    rows = json.loads(out.read_text())["comm"]
    assert [r["bytes"] for r in rows] == [1 << 20, 4 << 20]
    for r in rows:
        algbw = r["bytes"] / r["all_reduce_s"] / 1e9
        assert r["all_reduce_busbw_gbps"] == pytest.approx(algbw * 2 * (2 - 1) / 2)
        assert r["all_gather_busbw_gbps"] == pytest.approx(r["bytes"] / r["all_gather_s"] / 1e9 * 0.5)


def test_rank_0_tokenizes_and_the_others_use_its_shards(kiln_bin, tmp_path):
    """Named datasets under torchrun: rank 0 tokenizes (overwrite_cache asks for it), rank 1 waits
    and opens rank 0's shards without tokenizing (LLaMA-Factory's main_process_first). A dataset
    rank 0 cannot read stops both ranks at once with its error, rather than leaving rank 1
    waiting until ddp_timeout."""
    import random
    rng = random.Random(5)
    words = "the a cat dog sat ran on under big small red house tree river".split()
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.jsonl").write_text("".join(
        json.dumps({"text": " ".join(rng.choice(words) for _ in range(60))}) + "\n" for _ in range(200)))
    (data / "dataset_info.json").write_text(json.dumps({"demo": {"file_name": "corpus.jsonl"}}))
    args = [*BASE, "--max_steps", 2, "--dataset", "demo", "--dataset_dir", data, "--tokenized_path", tmp_path / "tok",
            "--overwrite_cache", "true", "--output_dir", tmp_path / "run"]
    res = torchrun(kiln_bin, "kiln-pretrain", 2, *args, timeout=240)
    log = res.stdout + res.stderr
    assert log.count("datasets demo: tokenized") == 1, log[-3000:]
    assert log.count("rank 1: datasets demo: using the shards rank 0 prepared") == 1, log[-3000:]

    (data / "dataset_info.json").write_text(json.dumps({"demo": {"file_name": "missing.jsonl"}}))
    proc = start_torchrun(kiln_bin, "kiln-pretrain", 2, *args)
    try:
        out, err = proc.communicate(timeout=100)
    except BaseException:
        kill_torchrun(proc)
        raise
    assert proc.returncode != 0
    assert "missing.jsonl" in err and "rank 1: rank 0 could not prepare the training data" in err, err[-3000:]
