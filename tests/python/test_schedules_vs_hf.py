"""kiln's learning-rate schedules against transformers' get_scheduler (issue #53, item 4).

The golden file of tests/optim/test_schedule.cpp (optim/fixtures/hf_schedules.json: the learning
rate at every step of each schedule type, warmup 0 and > 0, a few lr_scheduler_kwargs each) must
equal what optim/fixtures/make_hf_schedules.py writes with the installed transformers, so the C++
test compares kiln with transformers itself, not with a file that drifted (or was edited by hand);
then that C++ test is run, comparing kiln's multipliers with the file to 1e-9."""
import importlib.util
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "optim" / "fixtures"


def load_script():
    spec = importlib.util.spec_from_file_location("make_hf_schedules", FIXTURES / "make_hf_schedules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore:Both num_training_steps and num_stable_steps")
def test_fixture_matches_installed_transformers():
    script = load_script()
    stored = json.loads((FIXTURES / "hf_schedules.json").read_text())
    fresh = json.loads(script.dump(script.build()))
    assert len(stored["cases"]) == len(fresh["cases"])
    for old, new in zip(stored["cases"], fresh["cases"]):
        assert {k: old[k] for k in old if k != "multipliers"} == {k: new[k] for k in new if k != "multipliers"}
        assert old["multipliers"] == pytest.approx(new["multipliers"], abs=1e-12, rel=0), (
            f"transformers {fresh['transformers']} disagrees with the stored fixture: {new['type']} {new['kwargs']}")


def test_fixture_covers_every_step_schedule_of_hf():
    # Every SchedulerType but the two that follow a metric rather than the step.
    from transformers.trainer_utils import SchedulerType

    stored = json.loads((FIXTURES / "hf_schedules.json").read_text())
    types = {c["type"] for c in stored["cases"]}
    assert types == {t.value for t in SchedulerType} - {"reduce_lr_on_plateau", "greedy"}
    assert {c["warmup_steps"] for c in stored["cases"]} >= {0, 6}


def test_kiln_equals_the_fixture(kiln_bin):
    import subprocess

    done = subprocess.run([str(kiln_bin("kiln_tests")), "every schedule equals transformers' get_scheduler at every step"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "All tests passed" in done.stdout
