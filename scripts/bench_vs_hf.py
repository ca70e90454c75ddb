#!/usr/bin/env python3
"""kiln against Hugging Face transformers on the same work, side by side (issue 17).

For each configuration (a model config.json, cutoff_len T, batch B, fp32 or bf16) this script

1. writes one Hugging Face model folder (config.json + model.safetensors) that both sides build
   from: `kiln-hf init` for a kiln preset, transformers' `save_pretrained` for a shape given here;
2. checks that the two compute the same thing before anything is timed: the same parameter count
   (kiln-profile's `num_parameters` vs transformers' `sum(p.numel())`) and, with those very
   weights on one batch, the same loss and the same gradient of every parameter (kiln through
   `kiln-hf forward --fused-loss`, the trainer's loss path, under `--autocast bf16` where kiln
   trains in bf16; transformers under `torch.autocast` likewise), within fp32/bf16 tolerance;
3. times the training step of both, alternating kiln and transformers for `--rounds` rounds (the
   order flips every round): kiln through `kiln-profile` (kiln-pretrain's own step,
   train::TrainingStack::step), transformers in a fresh Python process doing what HF Trainer does
   per step: LlamaForCausalLM(config.json) with attn_implementation="sdpa", forward under bf16
   autocast where kiln uses bf16, loss.backward(), clip_grad_norm_(1.0),
   torch.optim.AdamW(fused=True, Trainer's decay groups, lr 5e-5 (kiln-profile's default; it
   decays linearly there and is constant here, which does not change the time), betas (0.9,
   0.999), eps 1e-8, weight decay 0), zero_grad(set_to_none=True);
4. reports per configuration the median ratio kiln / transformers of tokens/s, step time and
   peak memory, with their spread (min-max over rounds), as Markdown on stdout and JSON.

Memory is measured the same way for both. CUDA: the caching allocator's peak allocated bytes,
reset before each timed step (parameters and optimizer state held at the step's start count).
CPU: the process's peak resident set over the warmup and timed steps minus its resident set once
the model is built and before the optimizer exists (VmHWM reset by writing 5 to
/proc/self/clear_refs, then VmHWM - VmRSS from /proc/self/status): optimizer state, gradients,
activations and what the allocator keeps, as the OS sees it. Both processes use the same
LibTorch allocator. kiln's counted tensor bytes (kiln-profile's own CPU figure) go into the JSON
too, for kiln only.

Both sides get the same intra-op thread count (`--threads`: OMP_NUM_THREADS/MKL_NUM_THREADS in
both environments, torch.set_num_threads in transformers' process). kiln never loads Python: this
script only starts kiln's programs.

    scripts/bench_vs_hf.py                         # the issue's CPU table, a few minutes on 2 cores
    scripts/bench_vs_hf.py --device cuda --configs llama-100m:1024:8:bf16,llama-3.2-1b:2048:4:bf16
    scripts/bench_vs_hf.py --configs tiny:128:8:fp32 --rounds 2 --steps 3 --output out/
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Model shapes of the table that are not kiln presets: transformers LlamaConfig keys.
SHAPES = {
    # 11.4M parameters: hidden 256, 4 layers, vocabulary 32000 (tied)
    "h256-l4": dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    # 56M parameters: hidden 512, 8 layers, GQA 8 query / 4 KV heads (untied head)
    "h512-l8": dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False),
    # 148K parameters: per-step overhead
    "h64-l2": dict(vocab_size=320, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
}
PRESETS = ("tiny", "llama-100m", "llama-3.2-1b")
COMMON = dict(max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.02,
              bos_token_id=1, eos_token_id=2, hidden_act="silu")

# The quick CPU default (a few minutes on 2 cores): the smallest model and a 32000-vocabulary one.
QUICK_CPU = "tiny:128:8:fp32,h256-l4:256:4:fp32"
# The CPU table (--full): model:cutoff_len:batch:dtype.
DEFAULT_CPU = ("h256-l4:256:4:fp32,h512-l8:512:2:fp32,h512-l8:512:2:bf16,tiny:128:8:fp32,"
               "h256-l4:4096:1:fp32,h64-l2:16:1:fp32")
# The goal's shapes on a GPU (scripts/device_check.sh).
DEFAULT_CUDA = "llama-100m:1024:8:bf16,llama-100m:8192:1:bf16,llama-3.2-1b:2048:4:bf16"

# Parity tolerances: |loss_kiln - loss_hf| / |loss_hf| and, per parameter,
# max |g_kiln - g_hf| / max |g_hf|. fp32: summation order only; bf16: autocast's roundings of
# both (bf16 has 8 significant bits; gradients pass through several bf16 matmuls).
TOLERANCE = {"fp32": {"loss": 1e-5, "grad": 2e-3}, "bf16": {"loss": 1e-2, "grad": 0.1}}


def parse_configs(text: str) -> list[dict]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) != 4:
            raise SystemExit(f"--configs: '{item}' is not model:cutoff_len:batch:dtype")
        model, t, b, dtype = parts
        if model not in SHAPES and model not in PRESETS and not Path(model).exists():
            raise SystemExit(f"--configs: model '{model}' is none of {sorted(SHAPES) + list(PRESETS)} nor a folder")
        if dtype not in ("fp32", "bf16"):
            raise SystemExit(f"--configs: dtype '{dtype}' is not fp32 or bf16")
        out.append(dict(name=item, model=model, cutoff_len=int(t), batch=int(b), dtype=dtype))
    return out


def bench_env(threads: int) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# transformers' side: run in a fresh process per measurement (--hf-worker), so that its resident
# set and threads are its own, as kiln-profile's are.

def read_rss() -> tuple[int, int] | None:
    try:
        fields = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
        return fields["VmRSS"], fields["VmHWM"]
    except (OSError, KeyError, ValueError):
        return None


def reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hf_decay_groups(model, weight_decay: float):
    """HF Trainer's parameter groups (Trainer.get_decay_parameter_names: no decay for biases/norms)."""
    import re
    forbidden = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if any(re.search(f, name.lower()) for f in forbidden) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def hf_worker(spec: dict) -> dict:
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    torch.manual_seed(spec["seed"])
    config = AutoConfig.from_pretrained(spec["model_dir"])
    with torch.device(device):  # built and initialised where it trains, as kiln-profile does
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    rss_baseline = None
    if not cuda and reset_rss_peak():
        rss = read_rss()
        rss_baseline = rss[0] if rss else None
    optimizer = torch.optim.AdamW(hf_decay_groups(model, 0.0), lr=5e-5, betas=(0.9, 0.999), eps=1e-8, fused=True)
    params = [p for p in model.parameters()]
    g = torch.Generator().manual_seed(spec["seed"])
    ids = torch.randint(0, config.vocab_size, (spec["batch"], spec["cutoff_len"]), generator=g).to(device)
    labels = ids.clone()
    autocast = spec["dtype"] == "bf16"

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(spec["warmup"]):
        step()
    sync()
    seconds, peak = 0.0, 0
    for _ in range(spec["steps"]):
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        step()
        sync()
        seconds += time.perf_counter() - t0
        if cuda:
            peak = max(peak, torch.cuda.max_memory_allocated(device))
    per_step = seconds / spec["steps"]
    trace_path = spec.get("trace")
    if trace_path:  # as kiln-profile sweep --trace: as many more steps under the profiler, not timed
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(spec["steps"]):
                step()
            sync()
        prof.export_chrome_trace(trace_path)
    out = {"seconds_per_step": per_step, "tokens_per_second": spec["batch"] * spec["cutoff_len"] / per_step,
           "num_parameters": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}
    if cuda:
        out["peak_bytes"] = float(peak)
    else:
        rss = read_rss()
        out["peak_bytes"] = float(rss[1] - rss_baseline) if rss and rss_baseline is not None else None
    return out


def hf_parity_worker(spec: dict) -> dict:
    """transformers' loss and gradients on the parity batch, with the folder's own weights."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    torch.set_num_threads(spec["threads"])
    model = LlamaForCausalLM.from_pretrained(spec["model_dir"], attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    ids = torch.randint(0, model.config.vocab_size, (spec["batch"], spec["cutoff_len"]), generator=g)
    save_file({"input_ids": ids, "labels": ids.clone()}, spec["batch_file"])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["dtype"] == "bf16"):
        loss = model(input_ids=ids, labels=ids.clone(), use_cache=False).loss
    if spec["grads"]:
        loss.backward()
        grads = {name: p.grad.detach().float().contiguous() for name, p in model.named_parameters()}
        save_file(grads, spec["grads_file"])
    return {"loss": loss.item(), "num_parameters": sum(p.numel() for p in model.parameters())}


# ---------------------------------------------------------------------------------------------
# The driver.

class Bench:
    def __init__(self, args):
        self.args = args
        self.build = Path(args.build_dir)
        self.work = Path(tempfile.mkdtemp(prefix="bench_vs_hf_"))
        self.env = bench_env(args.threads)

    def bin(self, name: str) -> str:
        path = self.build / "bin" / name
        if not path.exists():
            raise SystemExit(f"{path} is not built (scripts/build.sh)")
        return str(path)

    def run(self, cmd: list, timeout: float = 3600) -> subprocess.CompletedProcess:
        r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=self.env, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        return r

    def python_worker(self, mode: str, spec: dict) -> dict:
        r = self.run([sys.executable, __file__, mode, json.dumps(spec)])
        return json.loads(r.stdout.strip().splitlines()[-1])

    def model_dir(self, model: str) -> Path:
        """One HF folder per model: config.json + weights, written once and shared by both sides."""
        if Path(model).exists():
            return Path(model)
        d = self.work / f"model-{model}"
        if d.exists():
            return d
        if model in PRESETS:
            self.run([self.bin("kiln-hf"), "init", "--model", model, "--out", d, "--seed", 0])
        else:
            code = ("import sys, json, torch\n"
                    "from transformers import LlamaConfig, LlamaForCausalLM\n"
                    "torch.manual_seed(0)\n"
                    "m = LlamaForCausalLM(LlamaConfig(**json.loads(sys.argv[2])))\n"
                    "m.save_pretrained(sys.argv[1])\n")
            self.run([sys.executable, "-c", code, d, json.dumps({**COMMON, **SHAPES[model]})])
        return d

    def parity(self, c: dict, model_dir: Path) -> dict:
        """Same parameter count, loss and gradients on one batch, before anything is timed."""
        from safetensors.numpy import load_file
        import numpy as np

        tag = f"{c['model']}-{c['dtype']}".replace("/", "_")
        batch_file, grads_file, kiln_out = (self.work / f"{tag}-{n}.safetensors" for n in ("batch", "hf", "kiln"))
        grads = count_parameters(json.loads((model_dir / "config.json").read_text())) <= self.args.parity_grads_max
        spec = dict(model_dir=str(model_dir), threads=self.args.threads, seed=self.args.seed, dtype=c["dtype"],
                    batch=self.args.parity_batch, cutoff_len=min(c["cutoff_len"], self.args.parity_len),
                    batch_file=str(batch_file), grads_file=str(grads_file), grads=grads)
        hf = self.python_worker("--hf-parity-worker", spec)
        cmd = [self.bin("kiln-hf"), "forward", "--model", model_dir, "--batch", batch_file, "--out", kiln_out,
               "--fused-loss"] + (["--grads"] if grads else [])
        if c["dtype"] == "bf16":
            cmd += ["--autocast", "bf16"]
        self.run(cmd)
        kiln = load_file(str(kiln_out))
        hf_grads = load_file(str(grads_file)) if grads else {}
        kiln_loss = float(kiln["loss"])
        worst_name, worst = "", 0.0
        for name, gh in hf_grads.items():
            key = "grad." + name
            if key not in kiln:
                raise RuntimeError(f"parity: kiln has no gradient for {name}")
            gk = kiln[key].astype(np.float32)
            scale = float(np.abs(gh).max()) or 1.0
            err = float(np.abs(gk - gh).max()) / scale
            if err > worst:
                worst_name, worst = name, err
        tol = TOLERANCE[c["dtype"]]
        loss_rel = abs(kiln_loss - hf["loss"]) / abs(hf["loss"])
        for f in (batch_file, grads_file, kiln_out):
            f.unlink(missing_ok=True)
        return {"loss_kiln": kiln_loss, "loss_hf": hf["loss"], "loss_rel_diff": loss_rel, "grads_compared": grads,
                "grad_max_rel_diff": worst if grads else None, "grad_worst_parameter": worst_name,
                "num_parameters_hf": hf["num_parameters"], "tolerance": tol,
                "batch": spec["batch"], "cutoff_len": spec["cutoff_len"],
                "ok": loss_rel <= tol["loss"] and (not grads or worst <= tol["grad"])}

    def kiln_step(self, c: dict, model_dir: Path, trace_dir: Path | None = None) -> dict:
        out = self.work / "kiln-profile"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [self.bin("kiln-profile"), "sweep", "--model", model_dir, "--cutoff-len", c["cutoff_len"], "--batch-size",
               c["batch"], "--grad-accum", 1, "--dtype", c["dtype"], "--steps", self.args.steps, "--warmup",
               self.args.warmup, "--device", self.args.device, "--format", "json", "--output", out,
               "--peak-tflops", 1]
        if self.args.kernels:
            cmd += ["--kernels", self.args.kernels]
        if trace_dir:
            cmd += ["--trace", trace_dir]
        self.run(cmd)
        doc = json.loads((out / "profile.json").read_text())
        row = doc["rows"][0]
        if row["status"] != "ok":
            raise RuntimeError(f"kiln-profile: {row['status']}: {row['message']}")
        cuda = self.args.device == "cuda"
        return {"seconds_per_step": row["seconds_per_step"], "tokens_per_second": row["tokens_per_second"],
                "peak_bytes": row["peak_allocated_bytes"] if cuda else row.get("rss_peak_over_baseline_bytes"),
                "counted_peak_bytes": None if cuda else row["peak_allocated_bytes"],
                "num_parameters": doc["num_parameters"]}

    def hf_step(self, c: dict, model_dir: Path, trace: Path | None = None) -> dict:
        spec = dict(model_dir=str(model_dir), threads=self.args.threads, seed=self.args.seed, dtype=c["dtype"],
                    batch=c["batch"], cutoff_len=c["cutoff_len"], steps=self.args.steps, warmup=self.args.warmup,
                    device=self.args.device, trace=str(trace) if trace else None)
        return self.python_worker("--hf-worker", spec)


# --- per-op profile (--op-profile) ------------------------------------------------------------
# Both sides' traces are Chrome traces written by the same Kineto profiler (kiln-profile sweep --trace,
# torch.profiler's export_chrome_trace) and are summed by the same code below, so the two columns
# are measured alike: the self time of each op (its duration minus that of the ops nested in it on
# the same thread), per step. Autograd's backward nodes appear as their ATen ops (nested in
# "autograd::engine::evaluate_function: ..." records, whose own self time is the engine's).


def op_self_times(trace_file: Path, steps: int) -> dict:
    """{op name: {"ms": self milliseconds per step, "calls": calls per step}} plus "_total"."""
    events = json.loads(Path(trace_file).read_text())["traceEvents"]
    by_thread: dict = {}
    kernels: dict = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            k = kernels.setdefault("[gpu] " + e["name"][:80], [0.0, 0])
            k[0] += e["dur"]
            k[1] += 1
        elif cat in ("cpu_op", "user_annotation", "python_function") and not e["name"].startswith("ProfilerStep"):
            if cat == "python_function":
                continue  # HF side with stacks on: Python frames are not ops
            by_thread.setdefault(e["tid"], []).append((e["ts"], e["dur"], e["name"]))
    ops: dict = {}
    total = 0.0
    for evs in by_thread.values():
        evs.sort(key=lambda x: (x[0], -x[1]))
        stack: list = []  # [end, name, time of the ops nested in it, duration]

        def close(until: float) -> None:
            while stack and stack[-1][0] <= until:
                _, name, nested, dur = stack.pop()
                o = ops.setdefault(name, [0.0, 0])
                o[0] += dur - nested
                o[1] += 1

        for ts, dur, name in evs:
            close(ts)
            if stack:
                stack[-1][2] += dur
            else:
                total += dur
            stack.append([ts + dur, name, 0.0, dur])
        close(float("inf"))
    out = {name: {"ms": v[0] / 1e3 / steps, "calls": v[1] / steps} for name, v in {**ops, **kernels}.items()}
    out["_total"] = {"ms": total / 1e3 / steps, "calls": 0}
    return out


def op_profile_markdown(c: dict, kiln: dict, hf: dict, top: int = 25) -> str:
    names = [n for n in set(kiln) | set(hf) if n != "_total"]
    names.sort(key=lambda n: -max(kiln.get(n, {}).get("ms", 0), hf.get(n, {}).get("ms", 0)))
    lines = [f"### {c['name']}: self time per step, top {top} ops by the larger side",
             "",
             f"Time in ops (top-level ops' durations summed): kiln {kiln['_total']['ms']:.1f} ms, "
             f"transformers {hf['_total']['ms']:.1f} ms per step.",
             "",
             "| op | kiln ms | kiln calls | HF ms | HF calls | kiln - HF ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for n in names[:top]:
        k, h = kiln.get(n, {"ms": 0.0, "calls": 0}), hf.get(n, {"ms": 0.0, "calls": 0})
        lines.append(f"| `{n}` | {k['ms']:.2f} | {k['calls']:g} | {h['ms']:.2f} | {h['calls']:g} | "
                     f"{k['ms'] - h['ms']:+.2f} |")
    rest_k = sum(v["ms"] for n, v in kiln.items() if n != "_total" and n not in names[:top])
    rest_h = sum(v["ms"] for n, v in hf.items() if n != "_total" and n not in names[:top])
    lines.append(f"| (the other ops) | {rest_k:.2f} | | {rest_h:.2f} | | {rest_k - rest_h:+.2f} |")
    return "\n".join(lines) + "\n"


def run_op_profile(bench: "Bench", configs: list[dict], out_dir: Path) -> int:
    """One kiln and one transformers run per configuration with traces; the per-op table."""
    parts = ["# kiln vs transformers per op (Kineto traces of both, summed alike)", ""]
    for c in configs:
        d = bench.model_dir(c["model"])
        tdir = out_dir / ("trace-" + c["name"].replace(":", "_").replace("/", "_"))
        shutil.rmtree(tdir, ignore_errors=True)
        tdir.mkdir(parents=True)
        k = bench.kiln_step(c, d, trace_dir=tdir / "kiln")
        h = bench.hf_step(c, d, trace=tdir / "hf.json")
        kiln_trace = next((tdir / "kiln").glob("trace_*.json"))
        kt, ht = op_self_times(kiln_trace, bench.args.steps), op_self_times(tdir / "hf.json", bench.args.steps)
        parts.append(op_profile_markdown(c, kt, ht))
        parts.append(f"Timed steps of the same runs: kiln {k['tokens_per_second']:.0f} tokens/s, "
                     f"transformers {h['tokens_per_second']:.0f} tokens/s.\n")
    text = "\n".join(parts)
    (out_dir / "op_profile.md").write_text(text)
    print(text, end="")
    return 0


def count_parameters(c: dict) -> int:
    """Parameters of a Llama config.json (no biases), for choosing how much parity to check."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    d = c.get("head_dim") or h // heads
    q, kv = heads * d, (c.get("num_key_value_heads") or heads) * d
    layer = h * q + 2 * h * kv + q * h + 3 * h * c["intermediate_size"] + 2 * h
    return c["num_hidden_layers"] * layer + h + c["vocab_size"] * h * (1 if c.get("tie_word_embeddings") else 2)


def summarize(values: list[float | None]) -> dict | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def ratios(rounds: list[dict], key: str) -> list[float | None]:
    out = []
    for r in rounds:
        k, h = r["kiln"].get(key), r["hf"].get(key)
        out.append(k / h if k is not None and h else None)
    return out


def fmt_ratio(s: dict | None) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def fmt_med(values: list, scale: float = 1.0, digits: int = 0) -> str:
    s = summarize([v * scale if v is not None else None for v in values])
    return "n/a" if not s else f"{s['median']:.{digits}f}"


def describe(c: dict, params: int) -> str:
    return f"{c['model']} ({params / 1e6:.3g}M), T{c['cutoff_len']} x B{c['batch']}, {c['dtype']}"


def markdown(doc: dict) -> str:
    mem = "max allocated" if doc["device"] == "cuda" else "peak RSS over model-ready"
    lines = [f"# kiln vs transformers {doc['transformers_version']} (torch {doc['torch_version']}), "
             f"{doc['device']}, {doc['threads']} threads, {doc['rounds']} rounds x {doc['steps']} timed steps "
             f"(+{doc['warmup']} warmup), kiln and transformers alternated", "",
             f"Ratios are kiln / transformers per round: median (min-max). Memory: {mem}, the same method for both.",
             "",
             "| model, shape | params (kiln = HF) | parity: loss kiln / HF, max grad diff | kiln tokens/s | HF tokens/s "
             "| tokens/s ratio | step time ratio | memory kiln / HF (MB) | memory ratio |",
             "| --- | --- | --- | ---: | ---: | --- | --- | ---: | --- |"]
    for r in doc["results"]:
        c, p = r["config"], r.get("parity") or {}
        if r.get("error"):
            lines.append(f"| {c['name']} | error: {r['error'][:200]} | | | | | | | |")
            continue
        rounds = r["rounds"]
        if not rounds:
            lines.append(f"| {c['name']} | not measured yet | | | | | | | |")
            continue
        gd = "grads not compared" if p.get("grad_max_rel_diff") is None else f"{p['grad_max_rel_diff']:.1e}"
        par = (f"{p['loss_kiln']:.5f} / {p['loss_hf']:.5f}, {gd}"
               f"{'' if p['ok'] else ' **MISMATCH**'}") if p else "skipped"
        mem_k = fmt_med([x["kiln"]["peak_bytes"] for x in rounds], 1e-6, 1)
        mem_h = fmt_med([x["hf"]["peak_bytes"] for x in rounds], 1e-6, 1)
        lines.append(
            f"| {describe(c, r['num_parameters'])} | {r['num_parameters']:,} "
            f"{'=' if r['same_parameter_count'] else '!='} | {par} "
            f"| {fmt_med([x['kiln']['tokens_per_second'] for x in rounds])} "
            f"| {fmt_med([x['hf']['tokens_per_second'] for x in rounds])} "
            f"| {fmt_ratio(r['ratios']['tokens_per_second'])} | {fmt_ratio(r['ratios']['seconds_per_step'])} "
            f"| {mem_k} / {mem_h} | {fmt_ratio(r['ratios']['peak_bytes'])} |")
    la = doc.get("load_average")
    if la:
        lines += ["", f"Load average (1 min) at start / end: {la[0]} / {la[1]}."]
    return "\n".join(lines) + "\n"


def reexec_in_setup_venv() -> None:
    """Started by a python3 without torch or transformers (the README's bare `scripts/bench_vs_hf.py`
    on a machine whose system Python lacks them): run again under scripts/setup.sh's venv
    ($KILN_PYTHON, else $KILN_HOME/venv/bin/python), once."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        return
    except ImportError:
        pass
    home = os.environ.get("KILN_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    py = os.environ.get("KILN_PYTHON") or os.path.join(home, "venv", "bin", "python")
    if os.environ.get("KILN_BENCH_REEXEC") or not os.access(py, os.X_OK) or \
            os.path.abspath(py) == os.path.abspath(sys.executable):
        raise SystemExit(f"bench_vs_hf: {sys.executable} has no torch/transformers; run scripts/setup.sh --tests "
                         f"(it makes {py}) or start this script with a Python that has them")
    os.environ["KILN_BENCH_REEXEC"] = "1"
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", help="model:cutoff_len:batch:dtype,... (models: presets "
                    f"{', '.join(PRESETS)}, shapes {', '.join(SHAPES)}, or an HF folder); default: tiny and "
                    "h256-l4 on CPU (--full: the issue's CPU table), the goal's GPU shapes with --device cuda")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--full", action="store_true", help="on CPU: the issue's whole table instead of the quick default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per measurement")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads of both sides")
    ap.add_argument("--kernels", default="", help="kiln-profile sweep --kernels (default: kiln's own default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parity-batch", type=int, default=2)
    ap.add_argument("--parity-len", type=int, default=64, help="tokens per sequence of the parity batch (at most)")
    ap.add_argument("--parity-grads-max", type=float, default=3e8,
                    help="compare every gradient up to this many parameters, the loss only above")
    ap.add_argument("--no-parity", action="store_true", help="skip the loss/gradient check (not recommended)")
    ap.add_argument("--build-dir", default=os.environ.get("KILN_BUILD_DIR", str(ROOT / "build")))
    ap.add_argument("--output", default="bench_vs_hf", help="folder for bench_vs_hf.{md,json}")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting new rounds after this many seconds")
    ap.add_argument("--op-profile", action="store_true",
                    help="instead of the rounds: one traced run of each side per configuration and a per-op table "
                    "of self time per step (op_profile.md; traces under --output)")
    args = ap.parse_args()
    default = DEFAULT_CUDA if args.device == "cuda" else DEFAULT_CPU if args.full else QUICK_CPU
    configs = parse_configs(args.configs or default)

    reexec_in_setup_venv()
    import torch
    import transformers
    bench = Bench(args)
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.op_profile:
        try:
            return run_op_profile(bench, configs, out_dir)
        finally:
            shutil.rmtree(bench.work, ignore_errors=True)
    doc = {"device": args.device, "threads": args.threads, "rounds": args.rounds, "steps": args.steps,
           "warmup": args.warmup, "kernels": args.kernels or "default", "torch_version": torch.__version__,
           "transformers_version": transformers.__version__,
           "memory_method": "cuda: caching allocator max allocated, reset before each timed step"
           if args.device == "cuda" else "cpu: process VmHWM over the warmup and timed steps minus VmRSS with the "
           "model built and no optimizer yet (clear_refs 5), both processes",
           "load_average": [load_average(), None], "results": []}
    start = time.monotonic()

    def write():
        doc["load_average"][1] = load_average()
        (out_dir / "bench_vs_hf.json").write_text(json.dumps(doc, indent=2))
        (out_dir / "bench_vs_hf.md").write_text(markdown(doc))

    results = []
    for c in configs:
        r = {"config": c, "rounds": [], "parity": None}
        try:
            d = bench.model_dir(c["model"])
            r["model_dir"] = str(d)
            if not args.no_parity:
                r["parity"] = bench.parity(c, d)
                print(f"bench_vs_hf: parity {c['name']}: {r['parity']}", file=sys.stderr)
        except Exception as e:  # the table still shows the others
            r["error"] = str(e)
        results.append(r)
        doc["results"].append(r)
    write()
    for i in range(args.rounds):
        if args.budget_s and i > 0 and time.monotonic() - start > args.budget_s:
            print(f"bench_vs_hf: budget reached after {i} rounds", file=sys.stderr)
            break
        for r in results:
            if r.get("error"):
                continue
            c, d = r["config"], Path(r["model_dir"])
            try:
                sides = [("kiln", bench.kiln_step), ("hf", bench.hf_step)]
                if i % 2:
                    sides.reverse()
                m = {name: fn(c, d) for name, fn in sides}
            except Exception as e:
                r["error"] = str(e)
                continue
            r["rounds"].append(m)
            print(f"bench_vs_hf: round {i + 1} {c['name']}: kiln {m['kiln']['tokens_per_second']:.0f} tokens/s, "
                  f"HF {m['hf']['tokens_per_second']:.0f} tokens/s", file=sys.stderr)
            r["num_parameters"] = m["kiln"]["num_parameters"]
            hf_params = (r["parity"] or {}).get("num_parameters_hf", m["hf"]["num_parameters"])
            r["same_parameter_count"] = m["kiln"]["num_parameters"] == m["hf"]["num_parameters"] == hf_params
            r["ratios"] = {k: summarize(ratios(r["rounds"], k))
                           for k in ("tokens_per_second", "seconds_per_step", "peak_bytes")}
            write()
    write()
    print(markdown(doc), end="")
    shutil.rmtree(bench.work, ignore_errors=True)
    bad = [r["config"]["name"] for r in results
           if r.get("error") or not r["rounds"] or (r["parity"] and not r["parity"]["ok"])
           or not r.get("same_parameter_count")]
    if bad:
        print(f"bench_vs_hf: not comparable or failed: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--hf-worker", "--hf-parity-worker"):
        fn = hf_worker if sys.argv[1] == "--hf-worker" else hf_parity_worker
        print(json.dumps(fn(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
