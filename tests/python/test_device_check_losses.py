"""scripts/loss_check.py: the stored CPU reference and the comparison the GPU's 20 steps go through.

The reference file must be what `loss_check.py reference` writes for today's run arguments (the
GPU runs the file's arguments, so a change of RUN_ARGS without a new reference would compare two
different runs), and its own loss must fall. The comparison passes the reference against itself
and a copy jittered inside the tolerance, and fails a copy moved past it at one step, a scaled
copy, a missing or NaN step, and a run whose loss does not fall. No build is needed.
"""
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "loss_check.py"
spec = importlib.util.spec_from_file_location("loss_check", SCRIPT)
loss_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loss_check)


@pytest.fixture(scope="module")
def reference():
    return json.loads(loss_check.REFERENCE.read_text())


def write_log(path: Path, losses: dict) -> Path:
    """A trainer_log.jsonl as kiln-pretrain writes it (LLaMA-Factory's LogCallback keys)."""
    total = max(losses)
    lines = [json.dumps({"current_steps": s, "total_steps": total, "loss": v, "lr": 1e-4, "epoch": 0.0,
                         "percentage": round(s / total * 100, 2), "elapsed_time": "0:00:01",
                         "remaining_time": "0:00:01"}) for s, v in sorted(losses.items())]
    # The closing summary line has no "loss" (train_loss instead), as kiln-pretrain's.
    lines.append(json.dumps({"current_steps": total, "total_steps": total, "epoch": 0.0, "percentage": 100.0,
                             "elapsed_time": "0:00:01", "remaining_time": "0:00:00"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def compare_cli(tmp_path, losses: dict) -> subprocess.CompletedProcess:
    log = write_log(tmp_path / "trainer_log.jsonl", losses)
    return subprocess.run([sys.executable, str(SCRIPT), "compare", "--log", str(log)], capture_output=True,
                          text=True, timeout=60)


def test_the_reference_is_the_cpu_run_of_todays_arguments(reference):
    assert reference["args"] == loss_check.RUN_ARGS
    assert "--device" not in reference["args"] and "--output_dir" not in reference["args"]
    produced = reference["produced"]
    assert produced["command"].startswith("scripts/loss_check.py reference")
    assert produced["device"] == "cpu" and len(produced["commit"]) >= 40 and produced["date"][:2] == "20"
    losses = reference["losses"]
    assert len(losses) == loss_check.STEPS == 20 and all(math.isfinite(v) for v in losses)
    # From about ln(32000) (a random llama-100m) down: the trend the GPU run must show too.
    assert 10 < losses[0] < 11.5
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1


def test_the_reference_against_itself_and_jitter_inside_the_tolerance_passes(reference, tmp_path):
    ref = reference["losses"]
    r = compare_cli(tmp_path, dict(enumerate(ref, 1)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss_check: PASS: 20 of 20 steps" in r.stdout
    jittered = {s: v + (0.9 if s % 2 else -0.9) * max(loss_check.ABS_TOL, loss_check.REL_TOL * abs(v))
                for s, v in enumerate(ref, 1)}
    ok, lines = loss_check.compare(ref, jittered)
    assert ok, "\n".join(lines)


@pytest.mark.parametrize("change", ["one step past", "scaled", "missing step", "nan", "flat"])
def test_a_perturbed_copy_fails(reference, tmp_path, change):
    ref = reference["losses"]
    run = dict(enumerate(ref, 1))
    if change == "one step past":
        run[10] += 1.5 * max(loss_check.ABS_TOL, loss_check.REL_TOL * abs(ref[9]))
    elif change == "scaled":
        run = {s: v * 1.03 for s, v in run.items()}
    elif change == "missing step":
        del run[7]
    elif change == "nan":
        run[20] = float("nan")
    elif change == "flat":  # a run that does not learn: the first loss at every step
        run = {s: ref[0] for s in run}
    r = compare_cli(tmp_path, run)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "loss_check: FAIL" in r.stdout


def test_the_trend_is_judged_on_its_own():
    rising = [5.0 + 0.1 * i for i in range(20)]  # each step matches, but the loss rises
    ok, lines = loss_check.compare(rising, dict(enumerate(rising, 1)))
    assert not ok and any(line.startswith("trend:") and line.endswith("FAIL") for line in lines)
