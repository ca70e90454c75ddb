"""kiln-profile end to end on the CPU: the CI sweep (configs/profile/ci-tiny.yaml) in all four
formats. References: the FLOP formula recomputed here from the model's config.json-style fields
(independently of kiln's flops.cpp), the CSV/JSON/HTML parsers of the Python standard library,
and, where Chromium is installed, a headless screenshot of the HTML report."""
import csv
import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_COLUMNS = ["task", "fp16", "speed", "num_gpu", "batch size per gpu", "gradient_accumulation_steps",
                "cutoff_len", "memory usage (GB)", "memory bandwidth", "tensor core", "fp engine"]
TINY = dict(vocab=320, hidden=128, ffn=384, layers=2, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def ci_sweep(run_kiln, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    r = run_kiln("kiln-profile", "sweep", "--config", ROOT / "configs/profile/ci-tiny.yaml", "--output", out,
                 timeout=300)
    assert r.returncode == 0, r.stderr
    return r, out


def train_flops_per_token(t: int, vocab, hidden, ffn, layers, heads, kv_heads) -> float:
    d = hidden // heads
    q, kv = heads * d, kv_heads * d
    matmul = 2 * (layers * (hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * ffn) + vocab * hidden)
    attention = 2 * 2 * layers * heads * d * (t + 1) / 2
    return 3 * (matmul + attention)


def test_markdown_on_stdout_in_the_users_column_order(ci_sweep):
    r, out = ci_sweep
    # The first table is the user's; the per-component tables follow it.
    text = r.stdout.splitlines()
    first = next(i for i, l in enumerate(text) if l.startswith("|"))
    lines = []
    for l in text[first:]:
        if not l.startswith("|"):
            break
        lines.append(l)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[: len(USER_COLUMNS)] == USER_COLUMNS
    assert len(lines) == 2 + 4  # header, rule, 2 cutoff_len x 2 batch sizes
    assert (out / "profile.md").read_text() == r.stdout


def test_csv_rows_and_uncounted_columns_say_modelled(ci_sweep):
    _, out = ci_sweep
    rows = list(csv.DictReader((out / "profile.csv").open()))
    assert [(int(x["cutoff_len"]), int(x["batch size per gpu"])) for x in rows] == [(16, 1), (16, 2), (64, 1), (64, 2)]
    for x in rows:
        assert x["status"] == "ok"
        # No counters asked for: the traffic model's values, marked as such.
        for column in ("memory bandwidth", "tensor core", "fp engine"):
            assert re.fullmatch(r"\d+\.\d% \(model\)", x[column]), (column, x[column])
        assert x["speed"].endswith("it/s") or x["speed"].endswith("s/it")
        assert float(x["memory usage (GB)"]) > 0


def test_json_flops_memory_and_ratio(ci_sweep):
    _, out = ci_sweep
    doc = json.loads((out / "profile.json").read_text())
    assert doc["num_parameters"] == 475776 and doc["peak_tflops"] == 1.0
    for row in doc["rows"]:
        t = row["cutoff_len"]
        ref = train_flops_per_token(t, **TINY)
        assert row["flops_per_token"]["train"] == pytest.approx(ref, rel=1e-12)
        assert row["flops_per_token"]["six_n"] == 6 * 475776
        tokens = t * row["batch_size"] * row["gradient_accumulation_steps"]
        assert row["tokens_per_second"] == pytest.approx(tokens / row["seconds_per_step"], rel=1e-9)
        assert row["tflops"] == pytest.approx(ref * row["tokens_per_second"] / 1e12, rel=1e-9)
        assert row["mfu"] == pytest.approx(row["tflops"] / 1.0, rel=1e-9)
        assert sum(row["predicted_components"].values()) == pytest.approx(row["predicted_bytes"], rel=1e-12)
        assert row["measured_over_predicted"] == pytest.approx(row["peak_allocated_bytes"] / row["predicted_bytes"])
        assert 0.85 < row["measured_over_predicted"] < 1.15
        # The counted tensor peak starts from the fp32 parameters and AdamW moments (12 bytes each).
        assert row["peak_allocated_bytes"] >= 12 * 475776
        for column in ("memory_bandwidth", "tensor_core", "fp_engine"):
            assert row[f"{column}_modelled"] is not None and row[f"{column}_counted"] is None
            assert "--counters" in row[f"{column}_counted_reason"]
        assert row["mfu_exceeds_peak"] is False


class _Svg(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts, self.series, self.points, self.components, self.urls = [], [], 0, 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "")
        if tag == "svg" and cls == "chart":
            self.charts.append(a["id"])
        if tag == "path" and cls == "series":
            self.series.append((self.charts[-1], a["data-series"], a["d"]))
        self.points += tag == "circle" and cls == "point"
        self.components += tag == "rect" and cls == "component"
        for k in ("src", "href"):
            if k in a:
                self.urls.append(a[k])


def test_html_report_structure(ci_sweep):
    _, out = ci_sweep
    p = _Svg()
    p.feed((out / "profile.html").read_text())
    assert p.charts == ["chart-memory", "chart-speed", "chart-breakdown", "chart-roofline"]
    memory = [name for chart, name, _ in p.series if chart == "chart-memory"]
    speed = [name for chart, name, _ in p.series if chart == "chart-speed"]
    assert sorted(memory) == ["batch 1, gradient_accumulation_steps 1 measured", "batch 1, gradient_accumulation_steps 1 predicted",
                              "batch 2, gradient_accumulation_steps 1 measured", "batch 2, gradient_accumulation_steps 1 predicted"]
    assert sorted(speed) == ["batch 1, gradient_accumulation_steps 1", "batch 2, gradient_accumulation_steps 1"]
    assert all(d.count("L") == 1 for _, _, d in p.series)  # two cutoff_len points per line
    assert p.points == 6 * 2
    assert p.components >= 4 * 3  # parameters, optimizer and at least one more per bar
    assert p.urls == []  # self-contained: nothing to fetch


SI = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def one_two_five(v: float) -> bool:
    """v is 1, 2 or 5 times a power of ten."""
    e = math.floor(math.log10(v) + 1e-9)
    return any(math.isclose(v, m * 10.0**e, rel_tol=1e-9) for m in (1, 2, 5))


def test_chart_axes_tick_at_round_numbers(ci_sweep):
    _, out = ci_sweep
    html = (out / "profile.html").read_text()
    axes = 0
    for chart, body in re.findall(r'<svg class="chart" id="([^"]+)"(.*?)</svg>', html, re.S):
        for axis in "xy":
            labels = re.findall(rf'data-axis="{axis}">([^<]*)<', body)
            if not labels:
                continue
            values = []
            for label in labels:  # a plain number with an SI prefix: never 0.0131 or 3.24e+04
                m = re.fullmatch(r"(-?\d+(?:\.\d+)?)([kMGTPmun]?)", label)
                assert m, (chart, axis, label)
                values.append(float(m[1]) * SI[m[2]])
            assert len(values) >= 2 and values == sorted(values), (chart, axis, labels)
            steps = [b - a for a, b in zip(values, values[1:])]
            if all(math.isclose(d, steps[0], rel_tol=1e-6) for d in steps):  # linear: multiples of a 1-2-5 step
                assert one_two_five(steps[0]), (chart, axis, labels)
                assert all(math.isclose(v / steps[0], round(v / steps[0]), abs_tol=1e-6) for v in values), labels
            else:  # log: 1, 2 or 5 times a power of ten
                assert all(one_two_five(v) for v in values), (chart, axis, labels)
            axes += 1
    assert axes >= 5  # memory and speed (x, y), breakdown (x); the roofline's where the CPU has one


def test_html_screenshot_in_headless_chromium(ci_sweep, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: scripts/setup.sh --tests installs it for this check")
        pytest.skip("chromium is not installed (apt-get install chromium); the structural HTML test still ran")
    _, out = ci_sweep
    png = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                    "--window-size=1400,1600", (out / "profile.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 30_000  # a blank page compresses to a few KB


def test_oom_point_is_marked_and_the_sweep_goes_on(run_kiln, tmp_path):
    r = run_kiln("kiln-profile", "sweep", "--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--cutoff-len",
                 "16,1024", "--steps", "1", "--warmup", "0", "--peak-tflops", "1", "--memory-cap-bytes", "20000000",
                 "--format", "csv", "--output", tmp_path)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "profile.csv").open()))
    assert [x["status"] for x in rows] == ["ok", "OOM"]
    assert rows[1]["memory usage (GB)"] == "OOM"
    assert "memory cap" in r.stdout


def test_bad_input_names_the_option_or_key(run_kiln, tmp_path):
    r = run_kiln("kiln-profile", "sweep", "--model", "tiny", "--cutoff-len", "64,abc")
    assert r.returncode == 2 and "key 'cutoff_len'" in r.stderr and "abc" in r.stderr
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: tiny\ncutoff_lens: [64]\n")
    r = run_kiln("kiln-profile", "sweep", "--config", cfg)
    assert r.returncode == 2 and str(cfg) in r.stderr and "cutoff_lens" in r.stderr
    r = run_kiln("kiln-profile", "sweep", "--model", "tiny", "--dtype", "fp8")
    assert r.returncode == 2 and "dtype" in r.stderr and "fp8" in r.stderr
    cfg.write_text("model: tiny\ncounters: true\ncounter_steps: -2\n")
    r = run_kiln("kiln-profile", "sweep", "--config", cfg)
    assert r.returncode == 2 and str(cfg) in r.stderr and "counter_steps" in r.stderr and "-2" in r.stderr
