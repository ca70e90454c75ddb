"""The memory planner (kiln-profile plan) against the counting CPU allocator: under a memory cap,
the setting it recommends runs without running out, and the next larger micro-batch, which it
says does not fit, does hit the cap; for several caps. Also its formats and its errors."""
import csv
import json
import math
import os
import subprocess

import pytest

PLAN = ["plan", "--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--target-sequences", "32"]


def plan(run_kiln, tmp_path, memory, cutoff_len=256):
    res = run_kiln("kiln-profile", *PLAN, "--cutoff-len", str(cutoff_len), "--device-memory", str(memory), "--output",
                   tmp_path)
    assert res.returncode == 0, res.stderr
    return res, json.loads((tmp_path / "plan.json").read_text())


def sweep_status(run_kiln, tmp_path, batch, cap, every, cutoff_len=256):
    # every: 0 none, n every_n (1 = full), "selective"
    if every == "selective":
        extra = ["--gradient-checkpointing", "--gradient-checkpointing-policy", "selective"]
    else:
        extra = ["--gradient-checkpointing", "--gradient-checkpointing-every", str(every)] if every else []
    res = run_kiln("kiln-profile", "sweep", "--model", "tiny", "--cutoff-len", str(cutoff_len), "--batch-size",
                   str(batch), "--dtype", "fp32", "--device", "cpu", "--steps", "1", "--warmup", "0",
                   "--memory-cap-bytes", str(int(cap)), "--peak-tflops", "1", "--format", "json", "--output", tmp_path,
                   *extra)
    assert res.returncode == 0, res.stderr
    return json.loads((tmp_path / "profile.json").read_text())["rows"][0]["status"]


def test_recommendation_runs_and_the_next_micro_batch_hits_the_cap(run_kiln, tmp_path):
    _, free = plan(run_kiln, tmp_path / "free", "10GB")
    predicted = {r["micro_batch"]: r["needed_bytes"] for r in free["rows"] if r["policy"] == "none"}
    assert free["rows"][0]["recommended"] and free["rows"][0]["micro_batch"] == 32  # everything fits
    for b in (2, 4, 8):
        cap = math.sqrt(predicted[b] * predicted[2 * b])  # between the two predictions
        _, capped = plan(run_kiln, tmp_path / f"plan{b}", int(cap))
        best = next(r for r in capped["rows"] if r["recommended"])
        assert (best["micro_batch"], best["policy"]) == (b, "none"), best
        assert best["gradient_accumulation_steps"] == 32 // b
        bigger = next(r for r in capped["rows"] if r["micro_batch"] == 2 * b and r["policy"] == "none")
        assert not bigger["fits"]
        assert sweep_status(run_kiln, tmp_path / f"ok{b}", b, cap, 0) == "ok"
        assert sweep_status(run_kiln, tmp_path / f"oom{b}", 2 * b, cap, 0) == "OOM"


def test_recomputation_is_chosen_when_nothing_else_fits(run_kiln, tmp_path):
    # cutoff_len 1024, where activations outweigh tiny's 7.6 MB of weights and optimizer state.
    _, free = plan(run_kiln, tmp_path / "free", "10GB", 1024)
    need = {(r["micro_batch"], r["policy"]): r["needed_bytes"] for r in free["rows"]}
    # Micro-batch 1 with selective recomputation (and so without any) does not fit, with full
    # recomputation it does.
    cap = (need[(1, "selective")] + need[(1, "full")]) / 2
    assert need[(1, "full")] < cap < need[(1, "selective")] < need[(1, "none")]
    _, capped = plan(run_kiln, tmp_path / "tight", int(cap), 1024)
    best = next(r for r in capped["rows"] if r["recommended"])
    assert best["policy"] == "full" and best["gradient_checkpointing_every"] == 1 and best["micro_batch"] == 1
    assert sweep_status(run_kiln, tmp_path / "run", 1, cap, 1, 1024) == "ok"
    assert sweep_status(run_kiln, tmp_path / "plain", 1, cap, 0, 1024) == "OOM"


def test_selective_recomputation_is_chosen_between_none_and_full(run_kiln, tmp_path):
    # A cap between selective's and no recomputation's prediction at micro-batch 1: selective (no
    # matmul recomputed) ranks before full, runs under the cap, and no recomputation runs out.
    _, free = plan(run_kiln, tmp_path / "free", "10GB", 1024)
    need = {(r["micro_batch"], r["policy"]): r["needed_bytes"] for r in free["rows"]}
    cap = (need[(1, "none")] + need[(1, "selective")]) / 2
    _, capped = plan(run_kiln, tmp_path / "tight", int(cap), 1024)
    best = next(r for r in capped["rows"] if r["recommended"])
    assert (best["policy"], best["micro_batch"]) == ("selective", 1), best
    assert sweep_status(run_kiln, tmp_path / "run", 1, cap, "selective", 1024) == "ok"
    assert sweep_status(run_kiln, tmp_path / "plain", 1, cap, 0, 1024) == "OOM"


def test_plan_formats_and_device_names(run_kiln, tmp_path):
    res = run_kiln("kiln-profile", "plan", "--model", "llama-3.2-1b", "--cutoff-len", "2048,8192", "--device-memory",
                   "A100-80GB", "--target-tokens", "1048576", "--output", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Recommended: micro-batch" in res.stdout and "A100-80GB" in res.stdout
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["device_memory_bytes"] == 80e9 and doc["peak_tflops"] == 312.0
    for t in (2048, 8192):
        rows = [r for r in doc["rows"] if r["cutoff_len"] == t]
        assert sum(r["recommended"] for r in rows) == 1
        best = next(r for r in rows if r["recommended"])
        assert best["needed_bytes"] <= 80e9 and best["micro_batch"] * best["gradient_accumulation_steps"] * t >= 1048576
        # Ranked: every fitting row before every other, predicted tokens/s not increasing among them.
        fits = [r["fits"] for r in rows]
        assert fits == sorted(fits, reverse=True)
        speeds = [r["tokens_per_second"] for r in rows if r["fits"]]
        assert speeds == sorted(speeds, reverse=True)
    table = list(csv.reader((tmp_path / "plan.csv").open()))
    assert table[0][0] == "cutoff_len" and len(table) == len(doc["rows"]) + 1
    assert "<table>" in (tmp_path / "plan.html").read_text()


@pytest.mark.parametrize("args,message", [
    (["--device-memory", "eighty"], "key 'device_memory': 'eighty' is not a size"),
    (["--device-memory", "80GB", "--target-tokens", "8", "--target-sequences", "8"], "exactly one"),
    (["--device-memory", "80GB", "--target-sequences", "8", "--mfu", "2"], "mfu"),
])
def test_plan_errors_are_one_line(run_kiln, tmp_path, args, message):
    res = run_kiln("kiln-profile", "plan", "--model", "tiny", "--cutoff-len", "64", *args, "--output", tmp_path)
    assert res.returncode == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_auto_is_this_machines_device_unless_device_memory_names_a_gpu(run_kiln, tmp_path):
    # common/device.h's one resolver: auto is the GPU when there is one, else the CPU (plan once
    # read auto as CUDA on a machine without a GPU); a GPU by name, or device cuda, plans for a GPU
    # with or without one here, since nothing runs. Reference: torch's own view of this machine.
    import torch

    def planned_for_cuda(*args):
        res = run_kiln("kiln-profile", "plan", "--model", "tiny", "--target-sequences", 8, "--format", "json",
                       "--output", tmp_path, *args)
        assert res.returncode == 0, res.stderr
        return json.loads((tmp_path / "plan.json").read_text())["cuda"]

    assert planned_for_cuda("--device-memory", "80GB") is torch.cuda.is_available()
    assert planned_for_cuda("--device-memory", "A100-80GB") is True
    assert planned_for_cuda("--device-memory", "80GB", "--device", "cuda") is True
    assert planned_for_cuda("--device-memory", "80GB", "--device", "cpu") is False


def test_cuda_without_a_gpu_is_a_clear_error_in_every_program(run_kiln, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    for call in (("kiln-profile", "sweep", "--model", "tiny", "--device", "cuda"),
                 ("kiln-pretrain", "--dry-run", "--device", "cuda", "--output_dir", tmp_path),
                 ("kiln-profile", "explain", "--model", "tiny", "--cutoff-len", 16, "--batch-size", 1, "--device",
                  "cuda")):
        res = run_kiln(*call, timeout=60)
        assert res.returncode == 2 and "key 'device': 'cuda' but no CUDA device is present" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_auto_fit_applies_the_plan_in_the_banner(run_kiln, kiln_bin, tmp_path):
    # On a CPU the plan depends on the projections' GEMM (ops::linear: fp32 on a CPU without AMX,
    # the native bf16 one with AMX, where autocast's casts are kept five times per layer, not
    # twice: cost/memory.cpp); each is forced here, so that the test means the same on either.
    def dry_run(gemm):
        env = dict(os.environ, KILN_CPU_LOW_PRECISION_GEMM=gemm)
        return subprocess.run([str(kiln_bin("kiln-pretrain")), "--dry-run", "--auto-fit", "--model", "llama-100m",
                               "--cutoff_len", "1024", "--per_device_train_batch_size", "8", "--auto_fit_memory",
                               "2.3GB", "--bf16", "true"], capture_output=True, text=True, timeout=300, env=env)

    res = dry_run("fp32")
    assert res.returncode == 0, res.stderr
    assert "Instantaneous batch size per device = 2" in res.stdout
    assert "Gradient Accumulation steps = 4" in res.stdout
    assert "Auto-fit = micro-batch 2 x accumulation 4 x 1 rank = 8 sequences (target 8)" in res.stdout
    res = dry_run("native")
    assert res.returncode == 0, res.stderr
    assert "Instantaneous batch size per device = 1" in res.stdout
    assert "Gradient Accumulation steps = 8" in res.stdout
    assert "Auto-fit = micro-batch 1 x accumulation 8 x 1 rank = 8 sequences (target 8)" in res.stdout
    res = run_kiln("kiln-pretrain", "--dry-run", "--auto-fit", "--model", "llama-100m", "--cutoff_len", "1024",
                   "--auto_fit_memory", "1GB")
    assert res.returncode == 2 and "nothing fits" in res.stderr
