"""kiln-bench --ops attention on the CPU, through its JSON: one row per (T, D, implementation) for
kiln and the CPU SDPA, timings that are positive and consistent, and kiln's output equal to SDPA's.
References: the flash-attention repository's FLOP convention (forward 4*B*H*T*T*D halved for the
causal mask, backward 2.5x forward) recomputed here from the row's own shape and milliseconds; the
output check compares against at::scaled_dot_product_attention inside the program."""
import json
import os
import subprocess

import pytest

SEQLENS, HEAD_DIM, HEADS = (64, 100), 16, 4  # 100: not a multiple of kiln's 64-row blocks


def fwd_flops(b: int, h: int, t: int, d: int) -> float:
    return 4.0 * b * h * t * t * d / 2


@pytest.fixture(scope="module")
def bench(kiln_bin, tmp_path_factory):
    # One intra-op thread and the fastest of 5 samples: on a machine whose cores are busy with
    # other work, two spinning OpenMP threads make every call equally slow and could flip the
    # sign of backward = (fwd+bwd) - fwd; this run checks the bookkeeping, not CPU speed.
    path = tmp_path_factory.mktemp("bench") / "attention.json"
    cmd = [kiln_bin("kiln-bench"), "--device", "cpu", "--ops", "attention", "--seqlens", ",".join(map(str, SEQLENS)),
           "--head-dims", str(HEAD_DIM), "--iters", "5", "--json", path]
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return r, json.loads(path.read_text())


def test_rows_for_kiln_and_cpu_sdpa(bench):
    _, doc = bench
    assert doc["device"] == "cpu" and doc["dtype"] == "fp32" and doc["results"] == []
    rows = doc["attention"]
    assert sorted((r["seqlen"], r["head_dim"], r["impl"]) for r in rows) == sorted(
        (t, HEAD_DIM, impl) for t in SEQLENS for impl in ("kiln", "sdpa (cpu)"))
    for r in rows:
        assert r["supported"] and r["error"] is None, r
        assert (r["batch"], r["heads"], r["kv_heads"]) == (1, HEADS, HEADS)  # CPU defaults
        assert r["ms_fwd"] > 0 and r["ms_bwd"] > 0
        assert r["ms_fwd_bwd"] == pytest.approx(r["ms_fwd"] + r["ms_bwd"], rel=1e-9)
        assert r["peak_extra_bytes"] > 0 and r["peak_extra_bytes_fwd"] > 0


def test_tflops_follow_the_flop_convention(bench):
    _, doc = bench
    for r in doc["attention"]:
        f = fwd_flops(r["batch"], r["heads"], r["seqlen"], r["head_dim"])
        assert r["flops_fwd"] == pytest.approx(f, rel=1e-12)
        assert r["flops_bwd"] == pytest.approx(2.5 * f, rel=1e-12)
        assert r["tflops_fwd"] == pytest.approx(f / (r["ms_fwd"] * 1e-3) / 1e12, rel=1e-9)
        assert r["tflops_bwd"] == pytest.approx(2.5 * f / (r["ms_bwd"] * 1e-3) / 1e12, rel=1e-9)
    for ratio in doc["attention_ratios"]:
        case = (ratio["seqlen"], ratio["head_dim"])
        rows = {r["impl"]: r for r in doc["attention"] if (r["seqlen"], r["head_dim"]) == case}
        assert ratio["versus"] == "sdpa (cpu)"
        assert ratio["fwd"] == pytest.approx(rows["kiln"]["tflops_fwd"] / rows["sdpa (cpu)"]["tflops_fwd"], rel=1e-9)
        assert ratio["bwd"] == pytest.approx(rows["kiln"]["tflops_bwd"] / rows["sdpa (cpu)"]["tflops_bwd"], rel=1e-9)
    assert len(doc["attention_ratios"]) == len(SEQLENS)


def test_kiln_output_matches_sdpa(bench):
    r, doc = bench
    for row in doc["attention"]:
        assert row["reference"] == "sdpa (cpu)"
        if row["impl"] == "kiln":
            assert row["max_abs_diff_vs_sdpa"] < 1e-4 and not row["mismatch"]
        else:
            assert row["max_abs_diff_vs_sdpa"] is None  # the reference itself
    assert "WARNING" not in r.stdout
    assert "| kiln |" in r.stdout and "| sdpa (cpu) |" in r.stdout


def test_bad_attention_options_are_named(run_kiln):
    r = run_kiln("kiln-bench", "--device", "cpu", "--ops", "attention", "--seqlens", "64,x")
    assert r.returncode == 2 and "key 'seqlens'" in r.stderr and "'x'" in r.stderr
    r = run_kiln("kiln-bench", "--device", "cpu", "--ops", "attention", "--heads", "4", "--kv-heads", "3")
    assert r.returncode == 2 and "key 'kv_heads'" in r.stderr


def test_packed_documents_against_sdpa_with_its_mask(kiln_bin, tmp_path):
    # --docs 3 at T = 100: documents of 33, 33 and 34 tokens. kiln gets the segment ids, SDPA the
    # [B, 1, T, T] mask built from them; the outputs must agree (an independent mask: causal and
    # same document), and the FLOPs count each document's causal triangle only.
    path = tmp_path / "docs.json"
    cmd = [kiln_bin("kiln-bench"), "--device", "cpu", "--ops", "attention", "--seqlens", "100", "--head-dims",
           str(HEAD_DIM), "--docs", "3", "--iters", "1", "--json", path]
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(path.read_text())
    rows = {row["impl"]: row for row in doc["attention"]}
    assert set(rows) == {"kiln", "sdpa mask"} and doc["attention_setup"]["docs"] == 3
    f = sum(fwd_flops(1, HEADS, n, HEAD_DIM) for n in (33, 33, 34))
    for row in rows.values():
        assert row["supported"] and row["docs"] == 3, row
        assert row["flops_fwd"] == pytest.approx(f, rel=1e-12)
    assert rows["kiln"]["reference"] == "sdpa mask" and rows["kiln"]["max_abs_diff_vs_sdpa"] < 1e-4
    assert doc["attention_ratios"][0]["versus"] == "sdpa mask"
    r = subprocess.run([str(kiln_bin("kiln-bench")), "--device", "cpu", "--docs", "3"], capture_output=True, text=True)
    assert r.returncode == 2 and "key 'docs'" in r.stderr
