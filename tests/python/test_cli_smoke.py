"""kiln-smoke end to end: the loss falls on the synthetic language, and bad arguments fail with a
message that names the argument and value (exit code 2), never a crash."""
import math
import re
from pathlib import Path


def test_smoke_run_learns(run_kiln):
    out = run_kiln("kiln-smoke", "--steps", "40")
    assert out.returncode == 0, out.stderr
    first, last = map(float, re.search(r"loss (\S+) -> (\S+)", out.stdout).groups())
    assert math.isclose(first, math.log(320), rel_tol=0.05)  # untrained: uniform over the vocabulary
    assert last < 0.5 * first


def test_bad_arguments_are_named(run_kiln):
    out = run_kiln("kiln-smoke", "--dtype", "fp8")
    assert out.returncode == 2 and "--dtype" in out.stderr and "'fp8'" in out.stderr
    out = run_kiln("kiln-smoke", "--model", "no-such-model")
    assert out.returncode == 2 and "no-such-model" in out.stderr and "tiny" in out.stderr
    out = run_kiln("kiln-smoke", "--steps", "abc")
    assert out.returncode == 2 and "steps" in out.stderr


def test_docs_embedding_shows_the_tested_service():
    """docs/embedding.md's example is tests/consumer/service.cpp, the file the consumer test builds."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs/embedding.md").read_text()
    assert (root / "tests/consumer/service.cpp").read_text() in doc
