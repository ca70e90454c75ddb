"""kiln-profile explain: the per-component traffic and FLOP table of one step (cost/traffic.h),
for llama-100m at cutoff_len 1024 x batch 8 in bf16 on an A100-80GB. References: the totals and
the per-token figures recomputed here from the table's own rows, each row's bound and time from
the A100's data-sheet numbers (312 TFLOP/s bf16, 19.5 TFLOP/s fp32, 2039 GB/s), and the matmul
FLOPs from the model's shape written out below (6 x matmul parameters x tokens, plus the causal
attention term), independently of kiln's flops.cpp."""
import json
import re
import time

import pytest

LLAMA_100M = dict(vocab=32000, hidden=768, ffn=2048, layers=12, heads=12, kv_heads=4)
T, B = 1024, 8
TOKENS = T * B
PEAK, FP32, BANDWIDTH = 312e12, 19.5e12, 2039e9


def cells(line: str) -> list:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.fixture(scope="module")
def explain(run_kiln):
    start = time.monotonic()
    r = run_kiln("kiln-profile", "explain", "--model", "llama-100m", "--cutoff-len", T, "--batch-size", B,
                 "--device-memory", "A100-80GB", "--dtype", "bf16", "--step-seconds", 1 / 6.99, timeout=60)
    seconds = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    rows, totals, passes = [], {}, {}
    for line in r.stdout.splitlines():
        if not line.startswith("| ") or line.startswith("| ---"):
            continue
        c = cells(line)
        if c[0] in ("component", "total", "pass", "variant"):
            continue
        if len(c) == 11:
            rows.append(dict(component=c[0], pass_=c[1], x=float(c[2]), gemm=float(c[3]), other=float(c[4]),
                             mb_kiln=float(c[5]), mb_eager=float(c[6]), intensity=float(c[7]), bound=c[8],
                             ms_kiln=float(c[9]), ms_eager=float(c[10])))
        elif len(c) == 8:
            totals[c[0]] = [float(x) for x in c[1:]]
        elif len(c) == 7:
            passes[c[0]] = [float(x) for x in c[1:]]
    return r.stdout, rows, totals, passes, seconds


def test_runs_without_building_anything(explain):
    out, rows, totals, _, seconds = explain
    # The model's arithmetic only: the program's start (LibTorch's libraries) is most of it.
    assert seconds < 10
    assert out.startswith("# kiln explain: llama-100m (100092672 parameters), bf16")
    assert len(rows) > 30 and set(totals) == {"per step (8192 tokens)", "per token"}
    assert re.search(r"ridge point 153\.0 FLOP/byte", out)


def test_totals_are_the_sums_of_the_rows(explain):
    _, rows, totals, _, _ = explain
    step, token = totals["per step (8192 tokens)"], totals["per token"]
    n = len(rows)
    # Rows are printed rounded (GFLOP to 0.0001, MB to 0.001, ms to 0.001); totals to 6 digits.
    for key, i, unit in (("gemm", 0, 1e-4), ("other", 1, 1e-4), ("mb_kiln", 3, 1e-3), ("mb_eager", 4, 1e-3)):
        assert sum(r[key] for r in rows) == pytest.approx(step[i], abs=n * unit / 2 + 1e-5 * step[i])
    assert sum(r["ms_kiln"] for r in rows) == pytest.approx(step[5], abs=n * 0.5e-3 + 1e-5 * step[5])
    assert sum(r["ms_eager"] for r in rows) == pytest.approx(step[6], abs=n * 0.5e-3 + 1e-5 * step[6])
    for s, t in zip(step, token):
        assert t == pytest.approx(s / TOKENS, rel=2e-5)


def test_per_pass_subtotals(explain):
    _, rows, totals, passes, _ = explain
    assert set(passes) == {"fwd", "bwd", "step"}  # no recomputation asked for
    step = totals["per step (8192 tokens)"]
    for name, sub in passes.items():
        mine = [r for r in rows if r["pass_"] == name]
        for key, i, unit in (("gemm", 0, 1e-4), ("other", 1, 1e-4), ("mb_kiln", 2, 1e-3), ("mb_eager", 3, 1e-3)):
            assert sum(r[key] for r in mine) == pytest.approx(sub[i], abs=len(mine) * unit / 2 + 1e-5 * sub[i])
    # The passes partition the step: GEMM, other, bytes kiln, bytes eager, ms kiln, ms eager.
    for i, j in ((0, 0), (1, 1), (2, 3), (3, 4), (4, 5), (5, 6)):
        assert sum(p[i] for p in passes.values()) == pytest.approx(step[j], rel=1e-5)


def test_matmul_flops_are_six_n_plus_attention(explain):
    _, rows, totals, _, _ = explain
    m = LLAMA_100M
    d = m["hidden"] // m["heads"]
    q, kv = m["heads"] * d, m["kv_heads"] * d
    # Every matmul weight once per token (tied head: the embedding matrix once, as the LM head).
    matmul_params = m["layers"] * (m["hidden"] * q + 2 * m["hidden"] * kv + q * m["hidden"] + 3 * m["hidden"] * m["ffn"]) \
        + m["vocab"] * m["hidden"]
    six_n = 6 * matmul_params * TOKENS / 1e9
    gemm_outside_attention = sum(r["gemm"] for r in rows if r["component"] != "attention core")
    assert gemm_outside_attention == pytest.approx(six_n, abs=len(rows) * 0.0005)
    # Attention: QK^T and PV over the causal half, 2 FLOPs per multiply-add; flash backward runs
    # five products against the forward's two (it recomputes QK^T), the model counts four.
    attention_fwd = 2 * 2 * m["layers"] * q * (T + 1) / 2 * TOKENS / 1e9
    attention = {r["pass_"]: r["gemm"] for r in rows if r["component"] == "attention core"}
    assert attention["fwd"] == pytest.approx(attention_fwd, abs=0.001)
    assert attention["bwd"] == pytest.approx(2.5 * attention_fwd, abs=0.001)
    model = totals["per step (8192 tokens)"][2]
    assert model == pytest.approx(six_n + 3 * attention_fwd, rel=1e-5)


def test_each_rows_bound_and_time_follow_the_roofline(explain):
    _, rows, _, _, _ = explain
    for r in rows:
        compute = r["gemm"] * 1e9 / PEAK + r["other"] * 1e9 / FP32
        memory = r["mb_kiln"] * 1e6 / BANDWIDTH
        assert r["ms_kiln"] == pytest.approx(max(compute, memory) * 1e3, abs=0.5e-3 + 1e-3 * r["ms_kiln"]), r
        if abs(compute - memory) > 0.01 * max(compute, memory):  # clear of the rounding
            assert r["bound"] == ("memory" if memory > compute else "compute"), r
        if r["mb_kiln"] > 1:
            assert r["intensity"] == pytest.approx((r["gemm"] + r["other"]) * 1e3 / r["mb_kiln"], abs=0.06 + 2e-3 * r["intensity"])


def test_gemm_rows_are_compute_bound_and_elementwise_rows_memory_bound(explain):
    _, rows, _, _, _ = explain
    by = {(r["component"], r["pass_"]): r for r in rows}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert by[(name, "fwd")]["bound"] == "compute"
    for name in ("input RMSNorm", "RoPE (q, k)", "SwiGLU", "residual adds (2)", "autocast casts"):
        assert by[(name, "fwd")]["bound"] == "memory"
    # The optimizer runs once per step, the layers once per layer.
    assert by[("AdamW", "step")]["x"] == 1 and by[("q_proj", "fwd")]["x"] == 12
    # The eager step's T x T scores and probabilities dominate its attention traffic.
    assert by[("attention core", "fwd")]["mb_eager"] > 10 * by[("attention core", "fwd")]["mb_kiln"]


def test_modelled_counters_at_a_measured_step(explain):
    out, _, totals, _, _ = explain
    step = totals["per step (8192 tokens)"]
    line = next(l for l in out.splitlines() if l.startswith("| kiln |"))
    bandwidth, tensor, fp = (float(x.rstrip("%")) for x in cells(line)[1:])
    seconds = 1 / 6.99
    assert bandwidth == pytest.approx(100 * step[3] * 1e6 / seconds / BANDWIDTH, abs=0.06)
    assert tensor == pytest.approx(100 * step[0] * 1e9 / PEAK / seconds, abs=0.06)
    assert fp == pytest.approx(100 * step[1] * 1e9 / FP32 / seconds, abs=0.06)


def explain_header_and_bytes(run_kiln, *flags):
    r = run_kiln("kiln-profile", "explain", "--model", "llama-100m", "--cutoff-len", T, "--batch-size", B,
                 "--device-memory", "A100-80GB", *flags, timeout=60)
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0]
    step = next(l for l in r.stdout.splitlines() if l.startswith("| per step"))
    return re.search(r"recomputation (\S+),", header).group(1), float(cells(step)[4])


def test_recomputation_follows_kiln_pretrains_rule(run_kiln):
    # train/recomputation.h, for kiln-pretrain, the sweep and explain alike: without a policy
    # the stride decides (>= 2: every_n), every_n defaults to 2, selective and full take no stride.
    none = explain_header_and_bytes(run_kiln)
    full = explain_header_and_bytes(run_kiln, "--gradient-checkpointing")
    every4 = explain_header_and_bytes(run_kiln, "--gradient-checkpointing", "--gradient-checkpointing-every", 4)
    every_n = explain_header_and_bytes(run_kiln, "--gradient-checkpointing", "--gradient-checkpointing-policy", "every_n")
    every_n4 = explain_header_and_bytes(run_kiln, "--gradient-checkpointing", "--gradient-checkpointing-policy", "every_n",
                                        "--gradient-checkpointing-every", 4)
    selective = explain_header_and_bytes(run_kiln, "--gradient-checkpointing", "--gradient-checkpointing-policy", "selective")
    assert (none[0], full[0], every4[0], every_n[0], every_n4[0], selective[0]) == (
        "none", "full", "every_4", "every_2", "every_4", "selective")
    assert every_n4 == every4
    # Recomputing 3 of 12 layers' forwards moves more than none, less than 6 of 12, less than all.
    assert none[1] < every4[1] < every_n[1] < full[1]


@pytest.mark.parametrize("flags, key, words", [
    (["--gradient-checkpointing", "--gradient-checkpointing-policy", "full", "--gradient-checkpointing-every", "4"],
     "gradient_checkpointing_every", "contradicts gradient_checkpointing_policy full"),
    (["--gradient-checkpointing", "--gradient-checkpointing-policy", "selective", "--gradient-checkpointing-every", "3"],
     "gradient_checkpointing_every", "contradicts gradient_checkpointing_policy selective"),
    (["--gradient-checkpointing", "--gradient-checkpointing-policy", "every_n", "--gradient-checkpointing-every", "1"],
     "gradient_checkpointing_every", "give n >= 2"),
    (["--gradient-checkpointing-every", "4"], "gradient_checkpointing_every",
     "no effect without gradient_checkpointing"),
])
def test_contradictory_recomputation_is_refused_by_explain_and_by_the_sweep(run_kiln, flags, key, words):
    r = run_kiln("kiln-profile", "explain", "--model", "llama-100m", "--cutoff-len", T, "--batch-size", B,
                 "--device-memory", "A100-80GB", *flags, timeout=60)
    assert r.returncode == 2 and key in r.stderr and words in r.stderr, r.stderr
    r = run_kiln("kiln-profile", "sweep", "--model", "tiny", "--cutoff-len", 16, "--batch-size", 1, "--steps", 1,
                 *flags, timeout=60)
    assert r.returncode == 2 and key in r.stderr and words in r.stderr, r.stderr


@pytest.mark.parametrize("command, flag, key", [
    (["explain"], ["--format", "md"], "format"),
    (["explain"], ["--trace", "/tmp/x"], "trace_dir"),
    (["explain"], ["--counters"], "counters"),
    (["plan", "--device-memory", "80GB", "--target-sequences", "8"], ["--batch-size", "4"],
     "per_device_train_batch_size"),
    (["plan", "--device-memory", "80GB", "--target-sequences", "8"], ["--config", "/nonexistent.yaml"], "config"),
    (["sweep"], ["--step-seconds", "1"], "step_seconds"),
    (["sweep"], ["--device-memory", "A100-80GB"], "device_memory"),
])
def test_a_key_of_another_subcommand_is_refused(run_kiln, command, flag, key):
    # Each subcommand reads its own key table; a key of another would be silently ignored.
    r = run_kiln("kiln-profile", *command, "--model", "tiny", "--cutoff-len", 16, *flag, timeout=60)
    assert r.returncode == 2, r.stdout
    assert f"key '{key}': not a key of kiln-profile {command[0]}" in r.stderr, r.stderr
    assert f"kiln-profile {command[0]} --help lists its keys" in r.stderr, r.stderr


@pytest.mark.parametrize("args, words", [
    (["--plan", "--explain", "--model", "tiny"], "--plan is now a subcommand: kiln-profile plan"),
    (["--model", "tiny", "--explain"], "--explain is now a subcommand: kiln-profile explain"),
    (["--model", "tiny"], "give a subcommand first: sweep, plan, explain or reference, not '--model'"),
    (["explain", "--device-memory", "A100-80GB", "--model", "tiny", "--device", "gpu"],
     "key 'device': 'gpu' is not auto, cpu or cuda"),
])
def test_the_old_modes_and_a_bad_device_are_refused_in_one_line(run_kiln, args, words):
    r = run_kiln("kiln-profile", *args, timeout=60)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_each_subcommand_has_its_own_help(run_kiln):
    top = run_kiln("kiln-profile", "--help")
    assert top.returncode == 0 and all(f"  {c} " in top.stdout for c in ("sweep", "plan", "explain")), top.stdout
    keys = {}
    for command in ("sweep", "plan", "explain"):
        r = run_kiln("kiln-profile", command, "--help")
        assert r.returncode == 0 and r.stdout.startswith(f"Usage: kiln-profile {command}"), r.stdout
        keys[command] = set(re.findall(r"^  --(\w+)", r.stdout, re.M))
    # Each lists its own keys only: the sweep's measurement keys are not plan's or explain's.
    assert {"counters", "steps", "learning_rate", "config"} <= keys["sweep"]
    assert {"target_tokens", "mfu", "device_memory"} <= keys["plan"] and not {"steps", "counters"} & keys["plan"]
    assert {"step_seconds", "json", "per_device_train_batch_size"} <= keys["explain"]
    assert not {"format", "counters", "target_tokens"} & keys["explain"]


def test_json_carries_the_modelled_counters_of_step_seconds(run_kiln, explain):
    out, _, totals, _, _ = explain
    markdown = next(l for l in out.splitlines() if l.startswith("| kiln |"))
    r = run_kiln("kiln-profile", "explain", "--json", "--model", "llama-100m", "--cutoff-len", T, "--batch-size", B,
                 "--device-memory", "A100-80GB", "--dtype", "bf16", "--step-seconds", 1 / 6.99, timeout=60)
    assert r.returncode == 0, r.stderr
    counters = json.loads(r.stdout)["modelled_counters"]
    assert counters["step_seconds"] == pytest.approx(1 / 6.99)
    kiln = counters["kiln"]
    shown = [float(x.rstrip("%")) for x in cells(markdown)[1:]]
    assert [100 * kiln[k] for k in ("memory_bandwidth", "tensor_core", "fp_engine")] == pytest.approx(shown, abs=0.051)
