"""kiln-profile reference (issue 52): the reference runs' rows predicted beside their measured figures.

References: the data file itself (configs/reference/llamafactory_runs.yaml, read here with PyYAML:
every measured row appears once, its speed and memory read back in seconds and bytes), the
tolerance rule recomputed from the printed figures, and the files the command writes. The
per-row ratios are pinned by tests/profile/test_reference_report.cpp."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "configs" / "reference" / "llamafactory_runs.yaml"


def seconds(speed: str) -> float:
    value, unit = speed.split()
    return 1 / float(value) if unit == "it/s" else float(value)


@pytest.fixture(scope="module")
def report(run_kiln):
    r = run_kiln("kiln-profile", "reference", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_measured_row_once_with_its_figures(report):
    data = yaml.safe_load(DATA.read_text())
    expected = []
    for t in data["tables"]:
        for row in t["rows"]:
            if "speed" in row and t.get("num_gpu", 1) == 1:
                expected.append((t["name"], row["cutoff_len"], row["batch"], row["accumulation"], row["speed"],
                                 row.get("memory_gb")))
    got = [(r["table"], r["cutoff_len"], r["batch"], r["accumulation"], r["measured"]["speed"]) for r in report["rows"]]
    assert got == [e[:5] for e in expected]
    assert len(got) == 18
    for r, e in zip(report["rows"], expected):
        assert r["measured"]["seconds"] == pytest.approx(seconds(e[4]))
        # nvidia-smi's MiB as the notes write them: 2579 MiB is "2.579".
        assert r["measured"]["memory_bytes"] == pytest.approx(e[5] * 1000 * 2**20)
    assert any("six V100" in u for u in report["not_predicted"])


def test_ratios_tolerances_and_reasons_agree(report):
    for r in report["rows"]:
        ref = r["reference"]
        assert ref["speed_ratio"] == pytest.approx(ref["step"]["seconds"] / r["measured"]["seconds"])
        assert ref["memory_ratio"] == pytest.approx(ref["memory"]["bytes"] / r["measured"]["memory_bytes"])
        assert ref["speed_within"] == (abs(ref["speed_ratio"] - 1) <= report["speed_tolerance"])
        assert ref["memory_within"] == (abs(ref["memory_ratio"] - 1) <= report["memory_tolerance"])
        # A figure outside its tolerance names what the model lacks; one within names nothing.
        misses = ref["misses"]
        assert any(m.startswith("speed") for m in misses) == (not ref["speed_within"])
        assert any(m.startswith("memory") for m in misses) == (not ref["memory_within"])
        # nvidia-smi's figure: the replayed segments plus the context; segments hold the live peak.
        mem = ref["memory"]
        assert mem["bytes"] == pytest.approx(mem["reserved_bytes"] + mem["context_bytes"])
        assert mem["reserved_bytes"] >= mem["allocated_bytes"] > 0
        # The step: per synchronised micro-batch the larger of host and device, then the optimizer's.
        s, a = ref["step"], r["accumulation"]
        assert s["seconds"] >= a * max(s["device_micro_batch_seconds"], 0) + s["device_step_seconds"] - 1e-12
        assert r["kiln"]["step"]["seconds"] > 0 and r["kiln"]["memory"]["bytes"] > 0


def test_markdown_and_files(run_kiln, tmp_path):
    r = run_kiln("kiln-profile", "reference", "--output_dir", tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# kiln reference")
    table = [l for l in r.stdout.splitlines() if l.startswith("| 100M model") or l.startswith("| 1B model")]
    assert len(table) >= 18
    assert re.search(r"Within tolerance: speed \d+ of 18 rows, memory \d+ of 18 rows", r.stdout)
    for f in ("reference.md", "reference.json", "reference.html"):
        assert (tmp_path / f).stat().st_size > 0
    html = (tmp_path / "reference.html").read_text()
    assert html.count("<svg") == 2 and "<table>" in html
    assert json.loads((tmp_path / "reference.json").read_text())["rows"]


def test_a_bad_data_file_names_the_file_and_the_key(run_kiln, tmp_path):
    text = DATA.read_text().replace('speed: "12.9 it/s"', 'speed: "12.9 fast"', 1)
    bad = tmp_path / "runs.yaml"
    bad.write_text(text)
    r = run_kiln("kiln-profile", "reference", "--data", bad, timeout=60)
    assert r.returncode == 2
    assert str(bad) in r.stderr and "tables[0].rows[0].speed" in r.stderr and "unit 'fast'" in r.stderr
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(DATA.read_text().replace("memory_gb: 4.5}", "memroy_gb: 4.5}", 1))
    r = run_kiln("kiln-profile", "reference", "--data", misspelt, timeout=60)
    assert r.returncode == 2
    assert str(misspelt) in r.stderr and "tables[0].rows[5].memroy_gb" in r.stderr and "unknown key" in r.stderr
    r = run_kiln("kiln-profile", "reference", "--data", tmp_path / "missing.yaml", timeout=60)
    assert r.returncode == 2 and "missing.yaml" in r.stderr
    r = run_kiln("kiln-profile", "reference", "--cutoff_len", "8", timeout=60)
    assert r.returncode == 2 and "cutoff_len" in r.stderr and "not a key of kiln-profile reference" in r.stderr


@pytest.mark.skipif(os.environ.get("KILN_SLOW_TESTS") != "1", reason="slow: set KILN_SLOW_TESTS=1")
def test_host_op_counts_recount():
    """scripts/measure_host_costs.py --check recounts transformers' and kiln's ops per step with
    torch.profiler / kiln-profile's trace and compares them with the committed file (~25 s)."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_host_costs.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
