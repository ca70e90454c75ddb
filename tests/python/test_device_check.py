"""scripts/device_check.sh without a GPU: its plan, and its own machinery on the `selftest` call.

The plan (`--plan`) comes from the table the calls execute; these tests hold it to issue #41's
shape: three calls, correctness, speed and scale in that order, each within its budget with its
set-up, and the steps each call must have. The `selftest` call runs fake steps through the real
step runner, trap and summary code: a step past its limit is stopped and the next one runs, and a
SIGTERM to the script mid-step still leaves the summary and the archive in $OUT with what the
earlier steps wrote, and no process of the stopped step behind. No build is needed.
"""
import os
import re
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_check.sh"
CALL_RE = re.compile(r"^call (\S+): budget (\d+) s = set-up (\d+) s \+ (\d+) steps (\d+) s \((-?\d+) s spare\)$")
STEP_RE = re.compile(r"^  (\S+) +(\d+) s  (.+)$")


def run_plan(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_DEVICE_")}
    env.update(env_extra or {})
    return subprocess.run([str(SCRIPT), "--plan", *args], capture_output=True, text=True, env=env, timeout=30)


def parse_plan(text):
    """[(call, budget, setup, printed_sum, [(step, limit, command)])] in the printed order."""
    calls = []
    for line in text.splitlines():
        m = CALL_RE.match(line)
        if m:
            name, budget, setup, n, total, spare = m.groups()
            calls.append(dict(name=name, budget=int(budget), setup=int(setup), n=int(n), total=int(total),
                              spare=int(spare), steps=[]))
            continue
        m = STEP_RE.match(line)
        assert m and calls, f"unparsed plan line: {line!r}"
        calls[-1]["steps"].append((m.group(1), int(m.group(2)), m.group(3)))
    return calls


@pytest.fixture(scope="module")
def plan():
    r = run_plan()
    assert r.returncode == 0, r.stdout + r.stderr
    return {c["name"]: c for c in parse_plan(r.stdout)}, [c["name"] for c in parse_plan(r.stdout)]


def test_three_calls_in_order_each_within_its_budget(plan):
    calls, order = plan
    assert order[:3] == ["correctness", "speed", "scale"]
    for c in calls.values():
        limits = [limit for _, limit, _ in c["steps"]]
        assert len(limits) == c["n"] and sum(limits) == c["total"], c["name"]
        assert c["budget"] == 420, c["name"]  # the default: a 480 s device command keeps its margin
        assert c["setup"] > 0 and c["setup"] + c["total"] <= c["budget"], c["name"]
        assert c["spare"] == c["budget"] - c["setup"] - c["total"]
        assert all(limit > 0 for limit in limits)
        names = [s for s, _, _ in c["steps"]]
        assert len(set(names)) == len(names), f"{c['name']}: a step name twice"


def test_correctness_runs_the_tests_both_ways_then_every_sanitizer_then_the_20_steps(plan):
    steps = plan[0]["correctness"]["steps"]
    names = [s for s, _, _ in steps]
    cmd = {s: c for s, _, c in steps}
    assert names[:2] == ["cuda_tests", "cuda_tests_volta"]
    for name in names[:2]:
        assert "CUDA_LAUNCH_BLOCKING=1" in cmd[name] and "--kiln-require-cuda" in cmd[name] and '"[cuda]' in cmd[name]
    assert "KILN_KERNEL_ARCH=70" in cmd["cuda_tests_volta"] and "KILN_KERNEL_ARCH" not in cmd["cuda_tests"]
    sanitizers = [f"{tool}{suffix}" for tool in ("memcheck", "racecheck", "synccheck", "initcheck")
                  for suffix in ("", "_volta")]
    assert names[2:10] == sanitizers
    for name in sanitizers:
        tool, _, path = name.partition("_")
        assert cmd[name] == f"sanitize {tool} {path or 'native'}"
    assert names[10] == "pretrain_20" and "loss_check.py run" in cmd["pretrain_20"] and "--device cuda" in cmd["pretrain_20"]


def test_sanitize_runs_the_sanitize_case_with_an_error_exit_code():
    # The one function every sanitizer step calls (the plan shows `sanitize TOOL PATH`).
    text = SCRIPT.read_text()
    body = text[text.index("\nsanitize() {"):]
    body = body[:body.index("\n}\n")]
    assert '--tool "$tool"' in body and "--error-exitcode 99" in body and '--log-file "$out/$current.sanitizer.txt"' in body
    assert '"$tests" --kiln-require-cuda "[sanitize]"' in body
    assert '[[ "$path" == volta ]] && export KILN_KERNEL_ARCH=70' in body
    # The [sanitize] case exists, tagged [cuda] too (skipped without a GPU, run by the [cuda] steps).
    case = (ROOT / "tests" / "ops" / "test_kernels_sanitize.cpp").read_text()
    assert '"[ops][cuda][sanitize]"' in case
    assert "ops/test_kernels_sanitize.cpp" in (ROOT / "tests" / "CMakeLists.txt").read_text()


def test_speed_starts_with_bench_vs_hf_and_scale_with_nccl(plan):
    calls = plan[0]
    speed = [(s, c) for s, _, c in calls["speed"]["steps"]]
    assert speed[0][0] == "bench_vs_hf" and "scripts/bench_vs_hf.py --device cuda" in speed[0][1]
    assert [s for s, _ in speed[1:]] == ["bench", "bench_fp16", "bench_fp16_volta", "attention", "attention_volta",
                                    "attention_docs", "gpu_constants"]
    assert all("kiln-bench" in c for _, c in speed[1:-1])
    # The reference model's GPU constants (issue 52), measured last.
    assert "scripts/measure_gpu_constants.py" in dict(speed)["gpu_constants"]
    assert "KILN_KERNEL_ARCH=70" in dict(speed)["bench_fp16_volta"] and "--ops attention" in dict(speed)["attention"]
    assert "--docs 8" in dict(speed)["attention_docs"]
    scale = [(s, c) for s, _, c in calls["scale"]["steps"]]
    assert [s for s, _ in scale[:3]] == ["nccl_zero0", "nccl_zero2", "comm"]
    assert all('"${torchrun[@]}"' in c for _, c in scale[:3])
    assert "--zero_stage 0" in scale[0][1] and "--zero_stage 2" in scale[1][1] and "--ops comm" in scale[2][1]
    assert any("[counters]" in c for _, c in scale) and any("kiln-profile" in c for _, c in scale)


def test_plan_follows_the_budget_and_refuses_a_call_it_does_not_know():
    r = run_plan("speed", env_extra={"KILN_DEVICE_BUDGET_S": "300"})
    assert r.returncode == 1  # over that budget
    (speed,) = parse_plan(r.stdout)
    assert speed["budget"] == 300 and speed["spare"] < 0
    assert run_plan("nosuch").returncode == 2


def steps_table(summary):
    """{step: result} from the summary's table."""
    rows = {}
    for line in summary.splitlines():
        m = re.match(r"^(\S+) +(\d+s) +(\S+)  (.+)$", line)
        if m:
            rows[m.group(1)] = m.group(4)
    return rows


@pytest.mark.parametrize("to_group", [True, False], ids=["process-group", "script-only"])
def test_selftest_limit_and_sigterm_keep_what_was_measured(tmp_path, to_group):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_DEVICE_")}
    env.update(OUT=str(out), KILN_DEVICE_WORK=str(work))
    proc = subprocess.Popen([str(SCRIPT), "selftest"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        started = work / "selftest" / "hang_started.txt"
        deadline = time.monotonic() + 60
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), "the hang step never started"
        # Before the signal: the earlier steps' files are already in $OUT.
        assert "after" in steps_table((out / "summary_selftest.txt").read_text())
        if to_group:
            os.killpg(proc.pid, signal.SIGTERM)  # as a launcher's timeout stops a command
        else:
            proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, output

    summary = (out / "summary_selftest.txt").read_text()
    rows = steps_table(summary)
    assert rows["first"] == "ok"
    assert rows["overrun"].startswith("timed out after 2s")
    assert rows["after"] == "ok"  # the step after the one past its limit ran
    assert rows["hang"] == "stopped by SIGTERM"
    assert rows["last"] == "not run"
    assert "device_check: stopped by SIGTERM" in summary and "during step hang" in summary
    assert "== stall after" in summary  # the overrun's diagnosis
    assert output.rstrip().endswith(summary.rstrip().splitlines()[-1])  # printed as well

    with tarfile.open(out / "device_results_selftest.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"first.txt", "after.txt", "hang_started.txt", "stalls.log", "steps.tsv", "env.log"} <= names
    assert not names & {"overrun_survived.txt", "hang_survived.txt", "last.txt"}
    assert sorted(p.name for p in out.iterdir()) == ["device_results_selftest.tar.gz", "summary_selftest.txt"]

    # The stopped steps' process groups are gone (env.log names them).
    groups = re.findall(r"^device_check: (overrun|hang) \(limit \d+s, process group (\d+)\)",
                        (work / "selftest" / "env.log").read_text(), re.M)
    assert [g for g, _ in groups] == ["overrun", "hang"]
    for _, pgid in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(int(pgid), 0)
