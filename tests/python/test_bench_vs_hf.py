"""scripts/bench_vs_hf.py end to end on the CPU at its smallest (the tiny preset, T 16 x B 2, two
rounds of one timed step): the JSON's structure, the parity check before timing (same parameter
count, loss and gradients of kiln's training loss and transformers' on one batch, with the same
weights), and the ratio arithmetic recomputed here from the per-round measurements. References:
transformers' LlamaForCausalLM (run by the script in its own process), the tiny preset's
hand-counted 475,776 parameters (tests/model/test_llama_config.cpp), statistics.median."""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_vs_hf.py"
T, B = 16, 2


def load_script():
    spec = importlib.util.spec_from_file_location("bench_vs_hf", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench(kiln_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_vs_hf")
    build = kiln_bin("kiln-profile").parents[1]
    cmd = [sys.executable, SCRIPT, "--configs", f"tiny:{T}:{B}:fp32", "--rounds", "2", "--steps", "1",
           "--warmup", "1", "--threads", "1", "--parity-len", "16", "--build-dir", build, "--output", out]
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "bench_vs_hf.json").read_text()), out


def test_json_structure_and_both_sides_measured(bench):
    _, doc, _ = bench
    assert doc["device"] == "cpu" and doc["threads"] == 1 and doc["rounds"] == 2
    assert doc["transformers_version"] and doc["torch_version"] and "clear_refs" in doc["memory_method"]
    (res,) = doc["results"]
    assert res["config"] == {"name": f"tiny:{T}:{B}:fp32", "model": "tiny", "cutoff_len": T, "batch": B,
                             "dtype": "fp32"}
    assert len(res["rounds"]) == 2
    for m in res["rounds"]:
        for side in ("kiln", "hf"):
            x = m[side]
            assert x["seconds_per_step"] > 0
            assert x["tokens_per_second"] == pytest.approx(T * B / x["seconds_per_step"], rel=1e-9)
            assert x["peak_bytes"] > 0  # RSS over the model-ready baseline: optimizer state at least
            assert x["num_parameters"] == 475776
        # kiln's counted tensor bytes: parameters + AdamW state (16 bytes per parameter) at least
        assert m["kiln"]["counted_peak_bytes"] >= 16 * 475776


def test_parity_checked_before_timing(bench):
    _, doc, _ = bench
    (res,) = doc["results"]
    p = res["parity"]
    assert p["ok"] and res["same_parameter_count"] and res["num_parameters"] == 475776
    assert p["num_parameters_hf"] == 475776
    assert p["batch"] == 2 and p["cutoff_len"] == T
    assert abs(p["loss_kiln"] - p["loss_hf"]) <= 1e-5 * p["loss_hf"]
    assert p["grad_max_rel_diff"] <= 2e-3
    # a random-init model on random tokens: the loss is near ln(V) = ln(320), not a degenerate 0
    assert 5.0 < p["loss_hf"] < 6.5


def test_ratios_are_the_median_and_spread_of_per_round_ratios(bench):
    _, doc, _ = bench
    (res,) = doc["results"]
    for key in ("tokens_per_second", "seconds_per_step", "peak_bytes"):
        per_round = [m["kiln"][key] / m["hf"][key] for m in res["rounds"]]
        s = res["ratios"][key]
        assert s["n"] == 2
        assert s["median"] == pytest.approx(statistics.median(per_round))
        assert s["min"] == pytest.approx(min(per_round)) and s["max"] == pytest.approx(max(per_round))
    # the step-time ratio is the inverse of the throughput ratio, round by round
    for m in res["rounds"]:
        t = m["kiln"]["tokens_per_second"] / m["hf"]["tokens_per_second"]
        assert t * (m["kiln"]["seconds_per_step"] / m["hf"]["seconds_per_step"]) == pytest.approx(1.0)


def test_markdown_on_stdout_is_the_md_file_with_one_row(bench):
    r, doc, out = bench
    assert r.stdout == (out / "bench_vs_hf.md").read_text()
    rows = [l for l in r.stdout.splitlines() if l.startswith("| tiny")]
    assert len(rows) == 1
    s = doc["results"][0]["ratios"]["tokens_per_second"]
    assert f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})" in rows[0]
    assert "475,776 =" in rows[0] and "MISMATCH" not in rows[0]


def test_summary_helpers_and_config_parsing():
    m = load_script()
    assert m.summarize([2.0, None, 1.0, 4.0]) == {"median": 2.0, "min": 1.0, "max": 4.0, "n": 3}
    assert m.summarize([None]) is None
    rounds = [{"kiln": {"x": 3.0}, "hf": {"x": 2.0}}, {"kiln": {"x": 1.0}, "hf": {"x": None}}]
    assert m.ratios(rounds, "x") == [1.5, None]
    assert m.parse_configs("tiny:128:8:fp32, h512-l8:512:2:bf16") == [
        {"name": "tiny:128:8:fp32", "model": "tiny", "cutoff_len": 128, "batch": 8, "dtype": "fp32"},
        {"name": "h512-l8:512:2:bf16", "model": "h512-l8", "cutoff_len": 512, "batch": 2, "dtype": "bf16"}]
    for bad in ("tiny:128:8", "nosuch:1:1:fp32", "tiny:1:1:fp8"):
        with pytest.raises(SystemExit):
            m.parse_configs(bad)
    # the shapes named after the issue's table have the parameter counts it gives
    def count(s):
        d = s["hidden_size"] // s["num_attention_heads"]
        q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
        h, f = s["hidden_size"], s["intermediate_size"]
        layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
        return s["num_hidden_layers"] * layer + h + s["vocab_size"] * h * (1 if s["tie_word_embeddings"] else 2)
    assert round(count(m.SHAPES["h256-l4"]) / 1e5) == 114  # 11.4M
    assert round(count(m.SHAPES["h512-l8"]) / 1e6) == 56


def test_op_self_times_subtracts_nested_ops_per_thread(tmp_path):
    """The per-op aggregation of --op-profile on a hand-made Chrome trace: a parent's self time is
    its duration minus its children's, threads are separate, GPU kernels are summed by name."""
    m = load_script()
    ev = [  # ts, dur in microseconds
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 10, "dur": 60},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "tid": 1, "ts": 20, "dur": 15},  # inside mm
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 1, "ts": 80, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 2, "ts": 5, "dur": 40},  # other thread
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "tid": 9, "ts": 0, "dur": 7},
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "tid": 9, "ts": 50, "dur": 3},
        {"ph": "i", "cat": "cpu_op", "name": "marker", "tid": 1, "ts": 3},
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": ev}))
    t = m.op_self_times(f, steps=2)  # per step: halves
    assert t["aten::linear"] == {"ms": (100 - 60 - 10) / 2e3, "calls": 0.5}
    assert t["aten::mm"] == {"ms": (60 - 15 + 40) / 2e3, "calls": 1.0}
    assert t["aten::copy_"]["ms"] == 15 / 2e3 and t["aten::add"]["ms"] == 10 / 2e3
    assert t["[gpu] gemm_kernel"] == {"ms": 10 / 2e3, "calls": 1.0}
    assert t["_total"]["ms"] == (100 + 40) / 2e3  # top-level ops only
    assert "marker" not in t


def test_op_profile_traces_both_sides(kiln_bin, tmp_path):
    """--op-profile end to end at the smallest shape: kiln-profile sweep --trace and torch.profiler write
    traces, both sides' matmuls and fused AdamW steps are found, the table is written."""
    build = kiln_bin("kiln-profile").parents[1]
    cmd = [sys.executable, SCRIPT, "--op-profile", "--configs", "h64-l2:16:1:fp32", "--steps", "2", "--warmup", "1",
           "--threads", "1", "--build-dir", build, "--output", tmp_path]
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    m = load_script()
    d = tmp_path / "trace-h64-l2_16_1_fp32"
    kiln = m.op_self_times(next((d / "kiln").glob("trace_cutoff_len16_batch1_gradient_accumulation_steps1.json")), 2)
    hf = m.op_self_times(d / "hf.json", 2)
    for side in (kiln, hf):
        # 7 weight matmuls per layer forward, 2 layers: every one ATen's.
        mm = side.get("aten::mm", {}).get("calls", 0)
        assert mm >= 2 * 7
        assert side["aten::_fused_adamw_"]["calls"] >= 1  # the optimizer ran under the profiler
    text = (tmp_path / "op_profile.md").read_text()
    assert text == r.stdout and "| `aten::mm` |" in text
