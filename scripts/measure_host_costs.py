#!/usr/bin/env python3
"""Host-side inputs of the reference runs' step-time model: op counts and host seconds per op.

Writes configs/reference/host_costs.yaml. The cost model predicts a step as
max(host time, device time) per micro-batch; this script gives the host side, measured on a CPU:

A. top-level aten ops per micro-batch (forward, backward) and per optimizer step of the reference
   runs' step: transformers' LlamaForCausalLM (sdpa, fp32 parameters) under LLaMA-Factory 0.9.0's
   defaults (reentrant gradient checkpointing, enable_input_require_grads, use_cache False) driven
   as HF Trainer drives it (loss, backward, nan/inf check, clip_grad_norm_ 1.0 foreach, AdamW
   foreach, scheduler, zero_grad; GradScaler extras apart). CPU bf16 autocast stands in for CUDA
   fp16 autocast.
B. host seconds per op: a step at tiny widths (compute negligible) over its op count.
C. the real HF Trainer's fixed cost per micro-batch and per optimizer step.
D. kiln's own step (build/bin/kiln-profile sweep --trace_dir), counted the same way.

What "top-level aten op" means (one definition for every phase and for kiln): an event of the
profiler's Chrome trace whose name starts with "aten::" and that has no enclosing "aten::" event
on the same thread. In forward and in the optimizer these are the ops Python (or kiln's C++)
dispatches; in backward the autograd engine runs nodes (autograd::engine::evaluate_function: X ->
X) and the aten ops directly inside a node count, as do the ops the reentrant checkpoint's
recomputation dispatches from Python inside CheckpointFunctionBackward. Ops nested inside another
aten op (aten::linear -> aten::addmm) are not counted. Non-aten ops ("detach" from the Python
binding, kiln's annotations) are not counted.

Usage:
  /tmp/tf445/bin/python scripts/measure_host_costs.py --other-python "$KILN_PYTHON"   # measure, write
  python scripts/measure_host_costs.py --check                                        # recount, compare
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "configs" / "reference" / "host_costs.yaml"
KILN_PROFILE = REPO / "build" / "bin" / "kiln-profile"
REFERENCE_LAYERS = 9  # configs/reference/llama3-100m.yaml
SEQ = 2  # tokens per sequence everywhere here: 1 token leaves HF's shifted loss empty (NaN)


# ---------------------------------------------------------------- trace counting


def count_top_level(events, phase_of):
    """Top-level aten ops per phase. events: Chrome-trace events; phase_of(ts) -> phase name."""
    by_tid = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "cpu_op" or not e["name"].startswith("aten::"):
            continue
        by_tid.setdefault(e["tid"], []).append((float(e["ts"]), -float(e["dur"])))
    counts = {}
    for evs in by_tid.values():
        evs.sort()
        stack = []  # end times of the open aten ops
        for ts, neg_dur in evs:
            while stack and stack[-1] <= ts:
                stack.pop()
            if not stack:
                p = phase_of(ts)
                counts[p] = counts.get(p, 0) + 1
            stack.append(ts - neg_dur)
    return counts


def annotations(events, prefix):
    return [(e["name"][len(prefix):], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
            and e["name"].startswith(prefix)]


def phase_by_annotation(spans):
    def phase_of(ts):
        for name, a, b in spans:
            if a <= ts <= b:
                return name
        return "other"
    return phase_of


# ---------------------------------------------------------------- the transformers step


def hf_model(layers, hidden=64, intermediate=128, vocab=256, heads=8, kv_heads=2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                      tie_word_embeddings=True, initializer_range=0.02, bos_token_id=0,
                      eos_token_id=1, attn_implementation="sdpa")
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).float()
    # LLaMA-Factory 0.9.0's defaults (model/model_utils/checkpointing.py, model/patcher.py)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model.config.use_cache = False
    model.train()
    return model


class HFStep:
    """One optimizer step as HF Trainer 4.45 + LLaMA-Factory 0.9.0 run it (CUDA's foreach paths)."""

    def __init__(self, model, dtype, scaler, foreach=True, mark=False):
        import torch
        self.torch = torch
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4, weight_decay=0.0, foreach=True)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)
        self.dtype = dtype
        self.scaler = torch.amp.GradScaler("cpu") if scaler else None
        self.foreach = foreach
        self.mark = mark
        self.tr_loss = torch.tensor(0.0)
        self.times = {}

    def phase(self, name):
        torch = self.torch
        if self.mark:
            return torch.profiler.record_function("phase::" + name)
        return _Timer(self.times, name)

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast("cpu", dtype=self.dtype)

    def __call__(self, batches, acc=1):
        torch = self.torch
        for x in batches[:acc]:
            with self.phase("forward"):
                with self.autocast():
                    out = self.model(input_ids=x, labels=x)
                loss = out.loss
                if acc > 1:
                    loss = loss / acc
            with self.phase("scaler_micro_batch"):
                scaled = self.scaler.scale(loss) if self.scaler is not None else loss
            with self.phase("backward"):
                scaled.backward()
            with self.phase("loss_tracking"):
                tr_loss_step = loss.detach()
                if torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step):
                    tr_loss_step = self.tr_loss / 1.0
                self.tr_loss += tr_loss_step
        with self.phase("step"):
            if self.scaler is not None:
                self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=self.foreach)
            if self.scaler is not None:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
            self.sched.step()
            self.model.zero_grad(set_to_none=True)


class _Timer:
    def __init__(self, times, name):
        self.times, self.name = times, name

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *a):
        self.times[self.name] = self.times.get(self.name, 0.0) + time.perf_counter() - self.t


def batches(vocab, n=4, seq=SEQ, batch=1):
    import torch
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, vocab, (batch, seq), generator=g) for _ in range(n)]


def hf_count(layers, dtype_name, scaler=False, seq=SEQ, **widths):
    """Top-level aten ops per phase of one optimizer step (accumulation 1) after 2 warm-up steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    dtype = {"bf16": torch.bfloat16, "fp32": None}[dtype_name]
    model = hf_model(layers, **widths)
    step = HFStep(model, dtype, scaler, mark=True)
    xs = batches(model.config.vocab_size, seq=seq)
    step(xs)
    step(xs)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(xs)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            ev = json.load(f)["traceEvents"]
    counts = count_top_level(ev, phase_by_annotation(annotations(ev, "phase::")))
    return {k: counts.get(k, 0) for k in
            ("forward", "scaler_micro_batch", "backward", "loss_tracking", "step", "other")}


def fit(c1, c2, c3, key):
    per_layer = c2[key] - c1[key]
    fixed = c1[key] - per_layer
    if c3[key] != fixed + 3 * per_layer:
        raise SystemExit(f"{key}: 3 layers count {c3[key]} != {fixed} + 3 x {per_layer}")
    return {"fixed": fixed, "per_layer": per_layer}


def step_fit(c, tensors_at_1):
    """The optimizer step as fixed + per_parameter_tensor x tensors (9 tensors per layer)."""
    f = fit(*c, "step")
    if f["per_layer"] % 9:
        raise SystemExit(f"step ops per layer {f['per_layer']} not a multiple of 9 tensors")
    per = f["per_layer"] // 9
    return {"fixed": c[0]["step"] - per * tensors_at_1, "per_parameter_tensor": per}


def hf_counts():
    """The transformers op counts (the part --check recounts)."""
    import transformers
    # widths do not change the counts: checked at two widths
    a = hf_count(1, "bf16")
    b = hf_count(1, "bf16", hidden=128, intermediate=384, vocab=512)
    if a != b:
        raise SystemExit(f"op counts depend on widths: {a} vs {b}")
    ops = {}
    raw = {}
    for dt in ("bf16", "fp32"):
        c = [hf_count(n, dt) for n in (1, 2, 3)]
        raw[dt] = c
        step_form = step_fit(c, tensors_at_1=11)  # tied: embedding + final norm + 9 per layer
        ops[dt] = {"forward": fit(*c, "forward"), "backward": fit(*c, "backward"),
                   "loss_tracking": {"fixed": c[0]["loss_tracking"]}, "step": step_form}
    # GradScaler extras: the bf16 step with and without the scaler, at 1 and 2 layers
    s1, s2 = hf_count(1, "bf16", scaler=True), hf_count(2, "bf16", scaler=True)
    n1, n2 = raw["bf16"][0], raw["bf16"][1]
    mb = lambda c: c["forward"] + c["scaler_micro_batch"] + c["backward"] + c["loss_tracking"]
    if mb(s2) - mb(s1) != mb(n2) - mb(n1) or s2["step"] - s1["step"] != n2["step"] - n1["step"]:
        raise SystemExit("GradScaler extras depend on the layer count")
    ops["grad_scaler"] = {"per_micro_batch": mb(s1) - mb(n1), "per_step": s1["step"] - n1["step"]}
    # LLaMA-Factory's collator also passes attention_mask (all ones); 4.45's sdpa mask check
    # (torch.all(attention_mask == 1)) then adds ops per forward: not in the counts above.
    return {"version": transformers.__version__, "ops": ops}


# ---------------------------------------------------------------- B: seconds per op


def hf_seconds_per_op(layers=REFERENCE_LAYERS, warmup=5, steps=20):
    import torch
    torch.set_num_threads(1)
    out = {}
    for dt_name, dt in (("bf16", torch.bfloat16), ("fp32", None)):
        counts = hf_count(layers, dt_name)
        model = hf_model(layers)
        step = HFStep(model, dt, False)
        xs = batches(model.config.vocab_size)
        rows = []
        for i in range(warmup + steps):
            step.times = {}
            t = time.perf_counter()
            step(xs)
            total = time.perf_counter() - t
            if i >= warmup:
                rows.append(dict(step.times, total=total))
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        n_all = sum(counts[k] for k in ("forward", "backward", "loss_tracking", "step"))
        out[dt_name] = {
            "forward": med["forward"] / counts["forward"],
            "backward": med["backward"] / counts["backward"],
            "step": med["step"] / counts["step"],
            "overall": med["total"] / n_all,
            "step_seconds": med["total"], "ops": n_all}
    return out


# ---------------------------------------------------------------- C: the real Trainer


def trainer_seconds(layers=REFERENCE_LAYERS, steps=60, warmup=10):
    """Trainer's own time: the wall time between on_step_end callbacks minus the time spent, in
    the same run, in the work a manual loop does (the model's forward with its loss, the
    outermost torch.autograd.backward, clip_grad_norm_, the optimizer's step, zero_grad). The
    difference per step at accumulation 1 and 4 gives per_micro_batch and per_step. (Subtracting
    a separate manual loop's step time instead was tried: on this 2-core machine the two runs'
    compute differed by +-5 ms a step, more than the overhead.)"""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments
    torch.set_num_threads(1)
    work = [0.0]

    def timed(fn, depth=[0]):
        def wrapper(*a, **k):
            if depth[0]:
                return fn(*a, **k)
            depth[0] += 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                work[0] += time.perf_counter() - t
                depth[0] -= 1
        return wrapper

    class Clock(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_step_end(self, args, state, control, **kw):
            self.rows.append((time.perf_counter(), work[0]))

    def data(n):
        return [{"input_ids": x[0], "labels": x[0]} for x in batches(256, n=n)]

    class TimedAdamW(torch.optim.AdamW):
        def step(self, *a, **k):
            return timed(super().step)(*a, **k)

    saved = (torch.autograd.backward, torch.nn.utils.clip_grad_norm_)
    res = {}
    try:
        torch.autograd.backward = timed(torch.autograd.backward)
        torch.nn.utils.clip_grad_norm_ = timed(torch.nn.utils.clip_grad_norm_)
        for acc in (1, 4):
            model = hf_model(layers)
            start = [0.0]
            model.register_forward_pre_hook(lambda *a: start.__setitem__(0, time.perf_counter()))
            model.register_forward_hook(
                lambda *a: work.__setitem__(0, work[0] + time.perf_counter() - start[0]))
            model.zero_grad = timed(model.zero_grad)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = TimedAdamW(params, lr=1e-4, weight_decay=0.0, foreach=True)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
            clock = Clock()
            with tempfile.TemporaryDirectory() as d:
                args = TrainingArguments(
                    output_dir=d, per_device_train_batch_size=1, gradient_accumulation_steps=acc,
                    max_grad_norm=1.0, logging_steps=10, report_to=[], save_strategy="no",
                    gradient_checkpointing=True,
                    gradient_checkpointing_kwargs={"use_reentrant": True}, bf16=False,
                    dataloader_num_workers=0, disable_tqdm=True, max_steps=steps + warmup,
                    use_cpu=True, learning_rate=1e-4, weight_decay=0.0, seed=0)
                tr = Trainer(model=model, args=args, train_dataset=data((steps + warmup) * acc),
                             optimizers=(opt, sched), callbacks=[clock])
                tr.train()
            r = clock.rows[warmup:]
            walls = [b[0] - a[0] for a, b in zip(r, r[1:])]
            overheads = [(b[0] - a[0]) - (b[1] - a[1]) for a, b in zip(r, r[1:])]
            res[acc] = (statistics.median(walls), statistics.median(overheads))
    finally:
        torch.autograd.backward, torch.nn.utils.clip_grad_norm_ = saved
    per_mb = (res[4][1] - res[1][1]) / 3
    return {"per_micro_batch": per_mb, "per_step": res[1][1] - per_mb,
            "trainer_step_acc1": res[1][0], "overhead_acc1": res[1][1],
            "trainer_step_acc4": res[4][0], "overhead_acc4": res[4][1]}


# ---------------------------------------------------------------- D: kiln


def kiln_model_yaml(d, layers, hidden=128, intermediate=384):
    text = (REPO / "configs" / "models" / "tiny.yaml").read_text()
    lines = []
    for line in text.splitlines():
        key = line.split(":")[0]
        if key == "num_hidden_layers":
            line = f"num_hidden_layers: {layers}"
        elif key == "hidden_size":
            line = f"hidden_size: {hidden}"
        elif key == "intermediate_size":
            line = f"intermediate_size: {intermediate}"
        lines.append(line)
    path = Path(d) / f"model_L{layers}_H{hidden}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def kiln_sweep(d, layers, dtype, steps, trace, hidden=128, intermediate=384):
    model = kiln_model_yaml(d, layers, hidden, intermediate)
    out = Path(d) / f"out_{layers}_{dtype}_{hidden}_{steps}"
    cmd = [str(KILN_PROFILE), "sweep", "--model", str(model), "--cutoff_len", str(SEQ),
           "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1",
           "--dtype", dtype, "--device", "cpu", "--steps", str(steps), "--warmup", "3",
           "--format", "json", "--output_dir", str(out)]
    if trace:
        cmd += ["--trace_dir", str(out / "trace")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # Bounded: a hung kiln-profile is killed (its own process, started here) rather than left behind.
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=120)
    prof = json.loads((out / "profile.json").read_text())
    if not trace:
        return prof
    ev = json.loads((out / "trace" / f"trace_cutoff_len{SEQ}_batch1_gradient_accumulation_steps1.json").read_text())["traceEvents"]
    bwd = [s for s in annotations(ev, "kiln::") if s[0] == "backward"]
    assert len(bwd) == 1, bwd
    _, a, b = bwd[0]
    return count_top_level(ev, lambda ts: "forward" if ts < a else "backward" if ts <= b else "step")


def kiln_counts():
    ops = {}
    with tempfile.TemporaryDirectory() as d:
        wide = kiln_sweep(d, 1, "bf16", 1, True, hidden=256, intermediate=512)
        if wide != kiln_sweep(d, 1, "bf16", 1, True):
            raise SystemExit("kiln's op counts depend on widths")
        for dt in ("bf16", "fp32"):
            c = [kiln_sweep(d, n, dt, 1, True) for n in (1, 2, 3)]
            ops[dt] = {"forward": fit(*c, "forward"), "backward": fit(*c, "backward"),
                       "step": step_fit(c, tensors_at_1=12)}  # untied: + lm_head
    return ops


def kiln_seconds_per_op(ops, steps=20):
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for dt in ("bf16", "fp32"):
            prof = kiln_sweep(d, REFERENCE_LAYERS, dt, steps, False, hidden=64, intermediate=128)
            sec = prof["rows"][0]["seconds_per_step"]
            n = sum(ops[dt][p]["fixed"] + REFERENCE_LAYERS * ops[dt][p]["per_layer"]
                    for p in ("forward", "backward"))
            n += ops[dt]["step"]["fixed"] + (3 + 9 * REFERENCE_LAYERS) * ops[dt]["step"]["per_parameter_tensor"]
            out[dt] = {"overall": sec / n, "step_seconds": sec, "ops": n}
    return out


# ---------------------------------------------------------------- output


def g3(x):
    return float(f"{x:.3g}")


def flow(d):
    items = []
    for k, v in d.items():
        if isinstance(v, dict):
            items.append(f"{k}: {flow(v)}")
        elif isinstance(v, float):
            items.append(f"{k}: {g3(v)}")
        else:
            items.append(f"{k}: {v}")
    return "{" + ", ".join(items) + "}"


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def write(hf, other, spo, trainer, kops, kspo, command):
    import torch
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y")
    L = []
    L += ["# Host-side inputs of the reference runs' step-time model (max(host, device) per",
          "# micro-batch): top-level aten ops per micro-batch / optimizer step and host seconds per op.",
          "# Written by scripts/measure_host_costs.py; `--check` recounts the ops.",
          f"# date: {now}",
          f"# machine: {cpu_model()}, {os.cpu_count()} cores, no GPU; torch.set_num_threads(1)",
          f"# torch {torch.__version__}; transformers {hf['version']} (counts, seconds, Trainer)"
          + (f" and {other['version']} (counts only, transformers_other)" if other else ""),
          f"# command: {command}",
          "#",
          "# Op = an aten:: event of torch.profiler's (kiln: LibTorch's Kineto) CPU trace with no",
          "# enclosing aten:: event on its thread: what Python / kiln's C++ dispatches in forward and",
          "# the optimizer, the ops directly inside each autograd node in backward (the reentrant",
          "# checkpoint's recomputation included). Counts at 1, 2 and 3 layers (fixed + per_layer x",
          "# num_hidden_layers, checked at 3) and at two widths (equal), sequence length 2, batch 1.",
          "# bf16 = CPU bf16 autocast standing in for CUDA fp16 autocast; fp32 = no autocast.",
          "# step = clip_grad_norm_(1.0, foreach) + AdamW(foreach).step() + LR scheduler +",
          "# zero_grad(set_to_none): fixed + per_parameter_tensor x parameter tensors (2 + 9 x layers",
          "# tied in transformers, 3 + 9 x layers in kiln's tiny): foreach kernels are one op per",
          "# list, but clip_grad_norm_ stacks norm.to(device) per tensor and AdamW (non-capturable)",
          "# reads each CPU step tensor twice with .item() (bias corrections) -- host ops, no sync.",
          "# loss_tracking = Trainer's per-micro-batch detach + isnan/isinf check (one host sync) +",
          "# tr_loss add; with gradient_accumulation_steps > 1 add 1 op (loss / acc) to forward.",
          "# grad_scaler = extra ops of scaler.scale(loss) (+ its backward) per micro-batch and",
          "# unscale_ + step + update per optimizer step (torch.amp.GradScaler('cpu')).",
          "# Not counted: LLaMA-Factory's collator also passes attention_mask (all ones), which",
          "# makes 4.45's sdpa path run torch.all(mask == 1) per forward (a few ops and a sync).",
          "# seconds_per_op: 9 layers (llama3-100m's depth) at hidden 64 / intermediate 128 / vocab",
          "# 256, median of 20 steps after 5 warm-up; per phase = phase time / phase ops.",
          "# trainer_seconds: real transformers Trainer (fp32, same tiny model, AdamW foreach passed",
          "# in, 60 steps after 10): wall time per step minus the time in the same run spent in",
          "# model forward, the outermost autograd.backward, clip_grad_norm_, optimizer.step and",
          "# zero_grad; medians at accumulation 1 and 4 solved for per_micro_batch and per_step.",
          "# It includes the loss_tracking ops above, the dataloader + collator, accelerate's loss",
          "# division and Trainer's loss.detach() / acc. Noisy here: two runs gave 1.9-2.4 ms and",
          "# 0.5-1.4 ms (the machine's speed varied 1.6x between runs).",
          "transformers:",
          f"  version: \"{hf['version']}\"",
          "  ops:"]
    for k, v in hf["ops"].items():
        L.append(f"    {k}: {flow(v)}")
    b = spo["bf16"]
    L.append(f"  seconds_per_op: {g3(b['overall'])}   # bf16; per phase and fp32 below")
    L.append(f"  seconds_per_op_detail: {flow(spo)}")
    L.append(f"  trainer_seconds: {flow({k: trainer[k] for k in ('per_micro_batch', 'per_step')})}")
    L.append(f"  trainer_timing: {flow({k: v for k, v in trainer.items() if k not in ('per_micro_batch', 'per_step')})}")
    L.append("  syncs: {per_micro_batch: 1, per_step_fp16: 1}   # isnan/isinf bool(); "
             "GradScaler.step's found_inf .item() (accelerate 1.x patches step, no get_scale)")
    if other:
        L.append("transformers_other:")
        L.append(f"  version: \"{other['version']}\"")
        L.append("  ops:")
        for k, v in other["ops"].items():
            L.append(f"    {k}: {flow(v)}")
    L.append("kiln:   # kiln-profile sweep --trace_dir (kiln's default: no recomputation): forward = before")
    L.append("        # the kiln::backward annotation, backward = inside it, step = after it")
    L.append("  ops:")
    for k, v in kops.items():
        L.append(f"    {k}: {flow(v)}")
    L.append(f"  seconds_per_op: {g3(kspo['bf16']['overall'])}   # bf16; seconds_per_step over ops")
    L.append(f"  seconds_per_op_detail: {flow(kspo)}")
    OUTPUT.write_text("\n".join(L) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="recount the op counts and exit 1 if they differ from the committed file")
    ap.add_argument("--other-python", help="a second interpreter (another transformers) to count with")
    ap.add_argument("--counts-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.counts_json:
        print(json.dumps(hf_counts()))
        return 0
    if args.check:
        import yaml
        saved = yaml.safe_load(OUTPUT.read_text())
        import transformers
        new = hf_counts()
        bad = []
        entry = next((saved[k] for k in ("transformers", "transformers_other")
                      if k in saved and saved[k]["version"] == transformers.__version__), None)
        if entry is None:
            print(f"no counts for transformers {transformers.__version__} in {OUTPUT}")
            return 1
        if entry["ops"] != new["ops"]:
            bad.append(f"transformers {new['version']}: {new['ops']} != {entry['ops']}")
        if KILN_PROFILE.exists():
            k = kiln_counts()
            if k != saved["kiln"]["ops"]:
                bad.append(f"kiln: {k} != {saved['kiln']['ops']}")
        else:
            print(f"{KILN_PROFILE} not built: kiln's counts not checked")
        for b in bad:
            print("differs:", b)
        return 1 if bad else 0
    t0 = time.time()
    hf = hf_counts()
    print("counts", hf, f"{time.time() - t0:.0f}s", flush=True)
    other = None
    if args.other_python:
        r = subprocess.run([args.other_python, __file__, "--counts-json"], check=True,
                           capture_output=True, text=True, timeout=300)
        other = json.loads(r.stdout.strip().splitlines()[-1])
        print("other", other, flush=True)
    spo = hf_seconds_per_op()
    print("seconds_per_op", spo, flush=True)
    trainer = trainer_seconds()
    print("trainer", trainer, flush=True)
    kops = kiln_counts()
    kspo = kiln_seconds_per_op(kops)
    print("kiln", kops, kspo, flush=True)
    command = " ".join([os.path.basename(sys.executable) if False else sys.executable,
                        "scripts/measure_host_costs.py"] + sys.argv[1:])
    write(hf, other, spo, trainer, kops, kspo, command)
    print(f"wrote {OUTPUT} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
