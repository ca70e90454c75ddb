#!/usr/bin/env python3
"""20 bf16 training steps of llama-100m on the GPU against the same run's losses on the CPU.

One run configuration, RUN_ARGS below (kiln-pretrain keys: the quick start's embedded corpus and
byte tokenizer, the llama-100m model, bf16 autocast, cutoff_len 128 x batch 4, 20 steps at a peak
learning rate of 3e-4, a loss logged every step, no evaluation); only `--device` differs. Weights are drawn on the CPU from the seed on either
device (LlamaForCausalLM::init_weights) and the data order does not depend on the device, so both
runs start from the same weights on the same batches and differ only by their arithmetic.

  scripts/loss_check.py reference --build-dir build [--output FILE]
      runs RUN_ARGS on the CPU and writes the reference (REFERENCE by default): the arguments, the
      losses and how they were produced (command, commit, date, machine, time taken).
  scripts/loss_check.py run --build-dir DIR --output OUT [--device cuda] [--reference FILE]
      runs the reference's own arguments on the device (scripts/device_check.sh's correctness
      call), keeps OUT/trainer_log.jsonl, writes OUT/loss_check.json and compares.
  scripts/loss_check.py compare --log trainer_log.jsonl [--reference FILE]
      the comparison alone.

The comparison (exit status 1 when it fails): every step 1..20 logged, finite, and within
max(ABS_TOL, REL_TOL x |reference|) of the reference's loss at that step; and the run's mean loss
over its last 5 steps below the mean over its first 5 (the loss falls). Why that tolerance: bf16
autocast rounds every matmul input to 8 significant bits (relative error up to 2^-9); the CPU
(oneDNN, kiln's CPU loops) and the GPU (cuBLAS, kiln's CUDA kernels) round at different points and
sum in different orders, so step 1 (the same weights and batch) differs by about 1e-3, and Adam's
normalised updates then carry such differences into every weight. A kernel that computes a wrong
value, a NaN or no update moves the loss by far more than 2% within a few steps, or stops its fall.
Standard library only: it runs under the GPU machine's python3 as it is.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "scripts" / "reference" / "llama-100m_bf16_20steps_cpu.json"
STEPS = 20
RUN_ARGS = [
    "--config", "quickstart", "--model", "llama-100m", "--bf16", "true",
    "--cutoff_len", "128", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
    "--learning_rate", "3.0e-4", "--warmup_ratio", "0.1", "--max_steps", str(STEPS),
    "--logging_steps", "1", "--eval_steps", "0", "--save_steps", "0", "--do_eval", "false", "--seed", "42",
]
ABS_TOL = 0.05
REL_TOL = 0.02
TREND_STEPS = 5


def read_log(path: Path) -> dict[int, float]:
    """{step: loss} of a trainer_log.jsonl (LLaMA-Factory's format: one JSON object a line)."""
    losses = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"loss_check: {path}: line {n} is not JSON ({e})")
        if "loss" in entry and "current_steps" in entry:
            loss = entry["loss"]
            losses[int(entry["current_steps"])] = float("nan") if loss is None else float(loss)
    return losses


def read_reference(path: Path) -> dict:
    try:
        ref = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"loss_check: reference {path}: {e}")
    for key in ("args", "losses", "produced"):
        if key not in ref:
            raise SystemExit(f"loss_check: reference {path}: field '{key}' is missing")
    if len(ref["losses"]) != STEPS:
        raise SystemExit(f"loss_check: reference {path}: field 'losses' has {len(ref['losses'])} values, not {STEPS}")
    return ref


def compare(reference: list[float], losses: dict[int, float]) -> tuple[bool, list[str]]:
    """Whether `losses` ({step: loss}) match `reference` (losses of steps 1..N), and a report."""
    lines = [f"{'step':>4}  {'reference':>10}  {'this run':>10}  {'diff':>8}  {'allowed':>8}"]
    ok = True
    got = []
    for step, want in enumerate(reference, 1):
        have = losses.get(step)
        allowed = max(ABS_TOL, REL_TOL * abs(want))
        if have is None or not math.isfinite(have):
            lines.append(f"{step:>4}  {want:>10.4f}  {'missing' if have is None else have:>10}  {'':>8}  {allowed:>8.4f}  FAIL")
            ok = False
            continue
        got.append(have)
        diff = have - want
        bad = abs(diff) > allowed
        ok &= not bad
        lines.append(f"{step:>4}  {want:>10.4f}  {have:>10.4f}  {diff:>+8.4f}  {allowed:>8.4f}" + ("  FAIL" if bad else ""))
    if len(got) == len(reference) and len(got) >= 2 * TREND_STEPS:
        first = sum(got[:TREND_STEPS]) / TREND_STEPS
        last = sum(got[-TREND_STEPS:]) / TREND_STEPS
        falls = last < first
        ok &= falls
        lines.append(f"trend: mean of the last {TREND_STEPS} steps {last:.4f} "
                     f"{'<' if falls else '>='} mean of the first {TREND_STEPS} {first:.4f}" + ("" if falls else "  FAIL"))
    else:
        ok = False
        lines.append("trend: not judged (steps missing)")
    lines.append(f"loss_check: {'PASS' if ok else 'FAIL'}: {len(got)} of {len(reference)} steps, "
                 f"tolerance max({ABS_TOL}, {REL_TOL:.0%} of the reference)")
    return ok, lines


def train(build_dir: Path, args: list[str], device: str, output: Path) -> float:
    """Runs kiln-pretrain with `args` on `device` into `output`; returns the seconds it took."""
    program = build_dir / "bin" / "kiln-pretrain"
    if not program.exists():
        raise SystemExit(f"loss_check: {program} is not built")
    cmd = [str(program), *args, "--device", device, "--output_dir", str(output), "--overwrite_output_dir", "true"]
    print("loss_check: " + " ".join(cmd), flush=True)
    start = time.monotonic()
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise SystemExit(f"loss_check: kiln-pretrain exited with status {rc}")
    return time.monotonic() - start


# What kiln-pretrain is built from (the library, the programs, the presets, the embedded corpus):
# uncommitted changes there make the commit an incomplete record of the run.
BUILT_FROM = ["lib", "apps", "configs", "cmake", "CMakeLists.txt", "third_party", "data"]


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--",
                                *BUILT_FROM], capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes to what kiln-pretrain is built from)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cmd_reference(a: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="kiln_loss_ref_") as tmp:
        seconds = train(Path(a.build_dir), RUN_ARGS, "cpu", Path(tmp) / "run")
        losses = read_log(Path(tmp) / "run" / "trainer_log.jsonl")
    values = [losses.get(step) for step in range(1, STEPS + 1)]
    if any(v is None or not math.isfinite(v) for v in values):
        raise SystemExit(f"loss_check: the CPU run logged {sorted(losses)}, not a finite loss at steps 1..{STEPS}")
    ok, lines = compare(values, losses)
    if not ok:  # its own trend: a reference whose loss does not fall proves nothing
        print("\n".join(lines))
        raise SystemExit("loss_check: the CPU run's loss does not fall: no reference written")
    ref = {
        "what": f"kiln-pretrain's loss at steps 1..{STEPS} on the CPU: the reference of scripts/loss_check.py "
                "(scripts/device_check.sh correctness, step pretrain_20)",
        "args": RUN_ARGS,
        "produced": {
            "command": f"scripts/loss_check.py reference --build-dir {a.build_dir}",
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{cpu_name()}, {os.cpu_count()} cores",
            "device": "cpu",
            "seconds": round(seconds, 1),
        },
        "losses": values,
    }
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(ref, indent=1) + "\n")
    tmp_out.replace(out)
    print(f"loss_check: wrote {out} ({seconds:.0f} s): " + ", ".join(f"{v:.4f}" for v in values))
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    ref = read_reference(Path(a.reference))
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    # The run's folder holds the final model (400 MB): outside `out`, removed after.
    tmp = Path(tempfile.mkdtemp(prefix="kiln_loss_run_"))
    try:
        seconds = train(Path(a.build_dir), ref["args"], a.device, tmp / "run")
        shutil.copy(tmp / "run" / "trainer_log.jsonl", out / "trainer_log.jsonl")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    losses = read_log(out / "trainer_log.jsonl")
    ok, lines = compare(ref["losses"], losses)
    print("\n".join(lines))
    (out / "loss_check.json").write_text(json.dumps({
        "device": a.device, "seconds": round(seconds, 1), "pass": ok, "reference": str(a.reference),
        "losses": [losses.get(s) for s in range(1, STEPS + 1)], "reference_losses": ref["losses"]}, indent=1) + "\n")
    return 0 if ok else 1


def cmd_compare(a: argparse.Namespace) -> int:
    ref = read_reference(Path(a.reference))
    ok, lines = compare(ref["losses"], read_log(Path(a.log)))
    print("\n".join(lines))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("reference", help="run on the CPU and write the reference")
    r.add_argument("--build-dir", required=True)
    r.add_argument("--output", default=str(REFERENCE))
    r.set_defaults(fn=cmd_reference)
    g = sub.add_parser("run", help="run the reference's arguments on a device and compare")
    g.add_argument("--build-dir", required=True)
    g.add_argument("--output", required=True)
    g.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    g.add_argument("--reference", default=str(REFERENCE))
    g.set_defaults(fn=cmd_run)
    c = sub.add_parser("compare", help="compare a trainer_log.jsonl with the reference")
    c.add_argument("--log", required=True)
    c.add_argument("--reference", default=str(REFERENCE))
    c.set_defaults(fn=cmd_compare)
    a = ap.parse_args()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
