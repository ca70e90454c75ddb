"""kiln's NVTX ranges (lib/kiln/common/nvtx.h) as an NVTX tool sees them: NVTX itself loads the
recorder (tests/tools/nvtx_recorder.cpp) through NVTX_INJECTION64_PATH, the way Nsight Systems
attaches, and the recorder writes every push and pop with its thread. Checked: every range is
closed on the thread that opened it, and the step's structure nests as documented."""
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("KILN_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))


def nvtx_build():
    state = (BUILD / "tests" / "nvtx.txt").read_text().strip()
    if not state.startswith("ON"):
        pytest.skip(f"this build has no NVTX ranges: {state}")
    recorder = BUILD / "tests" / "libkiln_nvtx_recorder.so"
    assert recorder.exists(), f"{recorder} is missing from a build with NVTX (tests/CMakeLists.txt builds it)"
    return recorder


def test_a_training_run_shows_its_steps_phases_and_components_as_nvtx_ranges(kiln_bin, tmp_path):
    recorder = nvtx_build()
    record = tmp_path / "nvtx.tsv"
    env = dict(os.environ, NVTX_INJECTION64_PATH=str(recorder), KILN_NVTX_RECORD=str(record))
    r = subprocess.run([str(kiln_bin("kiln-pretrain")), "--max_steps", "3", "--gradient_accumulation_steps", "2",
                        "--logging_steps", "1", "--eval_steps", "0", "--save_steps", "0",
                        "--output_dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr

    # Replay the pushes and pops per thread: each range with the ranges around it.
    stacks, ranges = {}, []
    for line in record.read_text().splitlines():
        tid, what, *name = line.split("\t")
        stack = stacks.setdefault(tid, [])
        if what == "push":
            ranges.append((name[0], tuple(stack)))
            stack.append(name[0])
        else:
            assert what == "pop" and stack, f"a pop without a push on thread {tid}"
            stack.pop()
    assert all(not s for s in stacks.values()), f"ranges left open: {stacks}"
    counts = Counter(name for name, _ in ranges)

    # 3 steps of 2 micro-batches: a step each, inside it a forward and a backward per micro-batch
    # and one optimizer range.
    assert counts["kiln::step"] == 3 and counts["kiln::optimizer"] == 3
    assert counts["kiln::forward"] == 6 and counts["kiln::backward"] == 6
    for name in ("kiln::forward", "kiln::backward", "kiln::optimizer"):
        assert all(outer == ("kiln::step",) for n, outer in ranges if n == name), name
    # Every model forward (training, and the final evaluation's) is one embedding lookup; in training
    # it sits in a kiln::forward, in evaluation in kiln::evaluate.
    lookups = [outer for n, outer in ranges if n == "kiln::embedding lookup"]
    assert sum(o == ("kiln::step", "kiln::forward") for o in lookups) == 6
    assert counts["kiln::evaluate"] >= 1
    assert all(o in (("kiln::step", "kiln::forward"), ("kiln::evaluate",)) for o in lookups), set(lookups)
    # Per decoder layer, once per forward: the projections, attention and norms.
    layers = counts["kiln::q_proj"] // len(lookups)
    assert layers >= 1 and counts["kiln::q_proj"] == layers * len(lookups)
    for name in ("kiln::k_proj", "kiln::v_proj", "kiln::o_proj", "kiln::attention core", "kiln::input RMSNorm",
                 "kiln::SwiGLU", "kiln::down_proj"):
        assert counts[name] == layers * len(lookups), name
    assert all(outer[-1] in ("kiln::forward", "kiln::evaluate") for n, outer in ranges if n == "kiln::q_proj")
