"""The golden file of tests/data/test_stream_order.cpp (fixtures/stream_orders.json) equals what
fixtures/make_stream_orders.py writes with HF datasets 4.0.0 in the LLaMA-Factory reference venv
(scripts/setup_lf_reference.sh), so the C++ test checks kiln's streaming order against datasets
itself, not against a file that drifted from it or was edited by hand. Skipped where that venv is
absent. The versions the file was written with are compared too: the orders belong to them."""
import json
import os
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
LF_PYTHON = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln")) / "venv-lf" / "bin" / "python"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    if not LF_PYTHON.exists():
        pytest.skip(f"no LLaMA-Factory reference venv at {LF_PYTHON} (scripts/setup_lf_reference.sh)")
    out = tmp_path_factory.mktemp("stream_orders") / "stream_orders.json"
    proc = subprocess.run(
        [str(LF_PYTHON), str(FIXTURES / "make_stream_orders.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_fixture_matches_datasets(fresh):
    stored_text = (FIXTURES / "stream_orders.json").read_text()
    fresh_text = fresh.read_text()
    stored, new = json.loads(stored_text), json.loads(fresh_text)
    assert (stored["datasets"], stored["numpy"]) == (new["datasets"], new["numpy"])
    assert len(stored["cases"]) == len(new["cases"])
    for old, cur in zip(stored["cases"], new["cases"]):
        assert old == cur, {k: v for k, v in cur.items() if k != "order"}
    for key in ("errors", "integers", "shuffles", "epoch_seeds"):
        assert stored[key] == new[key], key
    assert stored_text == fresh_text  # byte for byte, layout included


def test_fixture_shape():
    # What the C++ test leans on: orders are permutations of part of the documents (or, for
    # interleave_over, documents repeated), and the cases the header's rules come from are present.
    data = json.loads((FIXTURES / "stream_orders.json").read_text())
    total = lambda c: sum(c["lengths"])  # noqa: E731
    for c in data["cases"]:
        assert all(0 <= d < total(c) for d in c["order"])
        if c["strategy"] == "concat" or len(c["lengths"]) == 1:
            assert len(set(c["order"])) == len(c["order"])
    zero = [c for c in data["cases"] if c["num_shards"] == 0]
    assert zero and all(c["order"] == [] for c in zero)
    full = [c for c in data["cases"] if c["num_shards"] >= 1 and len(c["lengths"]) == 1 and c["part"] == "all"
            and c["num_workers"] == 0]
    assert full and all(sorted(c["order"]) == list(range(total(c))) for c in full)
    assert (FIXTURES / "stream_orders.json").stat().st_size < 300_000
