#!/usr/bin/env python3
"""Soak kiln-pretrain's stop paths: stop it with SIGTERM, SIGINT and SIGKILL at random moments,
resume, and require the result to equal an uninterrupted run bit for bit.

Moments (each stop aims at one, chosen at random; the report counts what the stop line says hit):
  setup   while the process starts: the data is opened, the model built (before any step)
  step    inside a training step (forward, backward, optimizer; the loader's prefetch thread runs)
  eval    inside an evaluation
  save    while a checkpoint is written (a .checkpoint-N.tmp folder exists)
  rotate  right after a checkpoint lands, when save_total_limit deletes the oldest
Checks of every stop:
  SIGTERM/SIGINT: exit 0 within --max-exit-seconds of the signal, the stop line on stderr;
  every stop: no glibc heap message, sanitizer report or crash; every checkpoint-N folder complete,
  its trainer_state.json readable and its model.safetensors readable by the `safetensors` package
  (an independent reader) with finite values; no half-written checkpoint under a checkpoint's name.
Each chain of stops ends with a run to max_steps; its trainer_state.json history must equal the
uninterrupted run's: every training step's loss, grad_norm and learning rate bit for bit, and every
evaluation both have (an evaluation cut by a stop is dropped, as documented, and only then).
--ddp N adds N stops of one rank of a two-rank Gloo job launched by torchrun --no-python.
--tokenize N adds N SIGTERMs while a named dataset is tokenized (exit 0, no partial cache left).

CI runs the short form (the CTest entry soak_stops); a developer runs the long one:
  scripts/soak_stops.py --term 150 --int 50 --kill 50 --ddp 10 --tokenize 5 --malloc-check
--malloc-check runs every process with glibc's malloc checking (libc_malloc_debug, MALLOC_CHECK_=3,
perturbed fresh and freed memory, tcache off: freed memory is reused at once, unlike ASan's
quarantine). Prints one JSON summary line; exit status 1 on any failure.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAP_TROUBLE = re.compile(
    r"corrupted|free\(\): |malloc\(\): |double free|invalid (pointer|size|next size)|malloc_consolidate|"
    r"AddressSanitizer|LeakSanitizer|runtime error:|Segmentation fault|core dumped|terminate called", re.I)
CHECKPOINT_FILES = ["config.json", "model.safetensors", "optimizer.safetensors", "loader_state.json",
                    "trainer_state.json", "kiln_data.json"]
MALLOC_DEBUG = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"


def run_args(max_steps, eval_steps, save_steps):
    return ["--max_steps", str(max_steps), "--logging_steps", "1", "--eval_steps", str(eval_steps),
            "--val_size", "24", "--per_device_eval_batch_size", "1", "--save_steps", str(save_steps),
            "--save_total_limit", "2", "--cutoff_len", "64", "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "2",
            "--learning_rate", "1e-3", "--warmup_ratio", "0.1"]


def checkpoints(out_dir):
    return sorted((p for p in Path(out_dir).glob("checkpoint-*") if p.name.split("-")[1].isdigit()),
                  key=lambda p: int(p.name.split("-")[1]))


def history(ckpt):
    """(training entries, evaluation entries) of a checkpoint's trainer_state.json."""
    log = json.loads((Path(ckpt) / "trainer_state.json").read_text())["log_history"]
    train = [(e["step"], e["loss"], e["grad_norm"], e["learning_rate"]) for e in log if "loss" in e]
    evals = {e["step"]: e["eval_loss"] for e in log if "eval_loss" in e}
    return train, evals


def check_checkpoint(ckpt, world):
    """'' when the checkpoint is whole and readable, else why not."""
    ckpt = Path(ckpt)
    files = CHECKPOINT_FILES + (["rng_state.safetensors"] if world == 1 else
                                [f"rng_state_{r}.safetensors" for r in range(world)])
    missing = [f for f in files if not (ckpt / f).exists()]
    if missing:
        return f"{ckpt.name}: missing {missing}"
    try:
        json.loads((ckpt / "trainer_state.json").read_text())
        from safetensors.numpy import load_file
        import numpy as np
        for name, t in load_file(str(ckpt / "model.safetensors")).items():
            if not np.isfinite(t).all():
                return f"{ckpt.name}: {name} has non-finite values"
    except Exception as e:  # noqa: BLE001 - any failure to read is the finding
        return f"{ckpt.name}: unreadable: {e}"
    return ""


class Soak:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.bin = Path(args.build_dir) / "bin" / "kiln-pretrain"
        self.work = Path(tempfile.mkdtemp(prefix="kiln-soak-", dir=args.work_dir))
        self.env = dict(os.environ)
        if args.malloc_check:
            self.env.update({"MALLOC_CHECK_": "3", "GLIBC_TUNABLES":
                             "glibc.malloc.perturb=165:glibc.malloc.tcache_count=0"})
            if Path(MALLOC_DEBUG).exists():
                self.env["LD_PRELOAD"] = (MALLOC_DEBUG + " " + self.env.get("LD_PRELOAD", "")).strip()
        self.failures = []
        self.stops = []  # one dict per stop
        self.chains = 0

    # ---- processes ------------------------------------------------------------------------------
    def spawn(self, out_dir, extra=(), ddp=False):
        resume = ["--resume_from_checkpoint", "true"] if checkpoints(out_dir) else []
        cmd = [str(self.bin), *self.args_, "--output_dir", str(out_dir), *resume, *extra]
        if ddp:
            cmd = [str(self.a.torchrun), "--standalone", "--nproc-per-node", "2", "--no-python", *cmd]
        log = open(self.work / "last.log", "w+")  # noqa: SIM115 - read back after the process ends
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=ddp)
        p.log = log
        p.started = time.monotonic()
        return p

    def finish(self, p, timeout):
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL) if p.args[0].endswith("torchrun") else p.kill()
            p.wait()
            p.timed_out = True
        p.log.seek(0)
        p.stderr = p.log.read()
        p.log.close()
        return p

    # ---- the uninterrupted reference ------------------------------------------------------------
    def reference(self, ddp):
        out = self.work / ("reference-ddp" if ddp else "reference")
        p = self.finish(self.spawn(out, ddp=ddp), timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed ({p.returncode}):\n{p.stderr[-3000:]}")
        train, evals = history(checkpoints(out)[-1])
        state = json.loads((out / "trainer_state.json").read_text())["log_history"]  # with the closing summary
        summary = state[-1]
        step_s = summary["train_runtime"] / max(1, self.max_steps)
        eval_s = max([e.get("eval_runtime", 0.0) for e in state if "eval_loss" in e] + [0.05])
        return {"train": train, "evals": evals, "step_seconds": step_s, "eval_seconds": eval_s}

    # ---- aiming a stop --------------------------------------------------------------------------
    def metrics_lines(self, out_dir):
        try:
            return [json.loads(l) for l in (Path(out_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]
        except (OSError, ValueError):
            return []

    def wait(self, p, pred, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if p.poll() is not None:
                return False
            if pred():
                return True
            time.sleep(0.001)
        return False

    def aim(self, p, out_dir, phase, ref):
        """Waits for the moment of `phase`; False when the run ended (or never got there) first."""
        start_lines = len(self.metrics_lines(out_dir))
        if phase == "setup":
            time.sleep(self.rng.uniform(0, 0.8))
            return p.poll() is None
        if phase == "step":
            k = start_lines + self.rng.randint(1, 12)
            ok = self.wait(p, lambda: len(self.metrics_lines(out_dir)) >= k, 120)
            time.sleep(self.rng.uniform(0, ref["step_seconds"]))
            return ok and p.poll() is None
        if phase == "eval":
            n = self.a.eval_steps
            ok = self.wait(p, lambda: any("loss" in m and m["step"] % n == 0 and m["step"] < self.max_steps
                                          for m in self.metrics_lines(out_dir)[start_lines:]), 120)
            time.sleep(self.rng.uniform(0, ref["eval_seconds"]))
            return ok and p.poll() is None
        if phase == "save":
            ok = self.wait(p, lambda: any(Path(out_dir).glob(".checkpoint-*.tmp")), 120)
            time.sleep(self.rng.uniform(0, 0.004))
            return ok and p.poll() is None
        if phase == "rotate":
            before = {c.name for c in checkpoints(out_dir)}
            ok = self.wait(p, lambda: bool({c.name for c in checkpoints(out_dir)} - before)
                           or any(Path(out_dir).glob(".checkpoint-*.deleting")), 120)
            return ok and p.poll() is None
        raise ValueError(phase)

    # ---- one stop -------------------------------------------------------------------------------
    def stop_once(self, out_dir, sig, phase, ref, ddp=False):
        """One run stopped by `sig` at `phase`; True when the chain's run has reached max_steps."""
        p = self.spawn(out_dir, ddp=ddp)
        if not self.aim(p, out_dir, phase, ref):
            self.finish(p, 600)
            return self.check_finished(p, out_dir, ddp)
        target = p.pid
        if ddp:  # one rank of the job, as a node's OOM killer or a person would
            ranks = worker_pids(p.pid)
            if ranks:
                target = self.rng.choice(ranks)
        # Before main() installs the handlers (while the dynamic loader maps LibTorch) a SIGTERM takes
        # its default action: the process ends having written nothing. Told apart by the kernel's
        # record of the signals the process catches.
        caught = sig == signal.SIGKILL or catches(target, sig)
        sent = time.monotonic()
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass
        self.finish(p, 120)
        elapsed = time.monotonic() - sent
        finished_alone = "finished at step" in p.stderr  # the signal came after the run's end
        hit = "none" if finished_alone else hit_of(p.stderr) if caught else "before-handlers"
        stop = {"signal": signal.Signals(sig).name, "phase": phase, "ddp": ddp, "exit": p.returncode,
                "seconds": round(elapsed, 3), "hit": hit}
        self.stops.append(stop)
        problems = []
        trouble = HEAP_TROUBLE.search(p.stderr)
        if trouble:
            problems.append("a heap/sanitizer message: " + trouble.group(0))
        if getattr(p, "timed_out", False):
            problems.append("did not exit within 120 s")
        if hit == "before-handlers":
            if not ddp and p.returncode != -sig:
                problems.append(f"stopped before its handlers, but exit status {p.returncode}")
        elif sig in (signal.SIGTERM, signal.SIGINT):
            if p.returncode != 0:
                problems.append(f"exit status {p.returncode}, not 0")
            elif stop["hit"] == "none" and not finished_alone:
                problems.append("no stop line in the output")
            if elapsed > self.a.max_exit_seconds:
                problems.append(f"took {elapsed:.1f} s to exit")
        elif not ddp and p.returncode not in (-signal.SIGKILL, 0):
            problems.append(f"SIGKILL, but exit status {p.returncode}")
        for c in checkpoints(out_dir):
            why = check_checkpoint(c, 2 if ddp else 1)
            if why:
                problems.append(why)
        if problems:
            self.fail(stop, problems, p.stderr)
        return self.done(out_dir)

    def done(self, out_dir):
        c = checkpoints(out_dir)
        return bool(c) and int(c[-1].name.split("-")[1]) == self.max_steps and \
            history(c[-1])[0] and history(c[-1])[0][-1][0] == self.max_steps

    def check_finished(self, p, out_dir, ddp):
        """The run ended on its own before the stop was sent: it must have succeeded."""
        if p.returncode != 0 or HEAP_TROUBLE.search(p.stderr):
            self.fail({"phase": "run to the end", "ddp": ddp}, [f"exit status {p.returncode}"], p.stderr)
        return self.done(out_dir)

    def fail(self, what, problems, stderr):
        self.failures.append({**what, "problems": problems, "stderr_tail": stderr[-1500:]})
        print(f"FAIL {what}: {problems}", file=sys.stderr)

    def compare(self, out_dir, ref, cut_evals):
        train, evals = history(checkpoints(out_dir)[-1])
        if train != ref["train"]:
            first = next((i for i, (a, b) in enumerate(zip(train, ref["train"])) if a != b),
                         min(len(train), len(ref["train"])))
            self.fail({"phase": "compare"}, [f"training history differs from the uninterrupted run at entry {first}: "
                                             f"{train[first:first + 1]} vs {ref['train'][first:first + 1]}"], "")
        for step, loss in ref["evals"].items():
            if step in evals and evals[step] != loss:
                self.fail({"phase": "compare"}, [f"eval at step {step}: {evals[step]} vs {loss}"], "")
            if step not in evals and step not in cut_evals:
                self.fail({"phase": "compare"}, [f"eval at step {step} missing, though no stop cut it"], "")

    # ---- chains ---------------------------------------------------------------------------------
    def chain(self, budget, ref, ddp=False):
        """Stops (each attempt spends one from `budget`, a dict signal -> count) until the budget is
        spent or the run reaches max_steps; then a run to the end, and the comparison."""
        out = self.work / f"chain-{self.chains}{'-ddp' if ddp else ''}"
        self.chains += 1
        cut_evals = set()
        phases = ["setup", "step", "step", "eval", "save", "rotate"]
        done = False
        while not done and any(n > 0 for n in budget.values()):
            sig = self.rng.choice([s for s, n in budget.items() if n > 0])
            budget[sig] -= 1
            done = self.stop_once(out, sig, self.rng.choice(phases), ref, ddp)
            if self.stops and self.stops[-1]["hit"].startswith("eval@"):
                cut_evals.add(int(self.stops[-1]["hit"].split("@")[1]))
        if not done:
            p = self.finish(self.spawn(out, ddp=ddp), 600)
            if p.returncode != 0 or not self.done(out):
                self.fail({"phase": "final run", "ddp": ddp}, [f"exit status {p.returncode}"], p.stderr)
                return
        self.compare(out, ref, cut_evals)

    def tokenize_stops(self, n):
        """SIGTERM while a named dataset is tokenized: exit 0, nothing of the partial cache left."""
        data = self.work / "named"
        data.mkdir()
        rng = random.Random(self.a.seed)
        words = ["kiln", "fires", "clay", "at", "high", "heat", "the", "potter", "waits", "glaze", "cools"]
        with open(data / "corpus.jsonl", "w") as f:
            for _ in range(240_000):  # about 50 MB: a few tokenizer chunks, over a second
                f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(40))}) + "\n")
        (data / "dataset_info.json").write_text(json.dumps({"soak": {"file_name": "corpus.jsonl",
                                                                     "columns": {"prompt": "text"}}}))
        cache = self.work / "tokenized"
        for i in range(n):
            out = self.work / f"tokenize-{i}"
            extra = ["--dataset", "soak", "--dataset_dir", str(data), "--overwrite_cache", "true",
                     "--tokenized_path", str(cache / "shards")]
            p = self.spawn(out, extra=extra)
            # Once the handlers are in (main has begun), somewhere in the tokenization.
            self.wait(p, lambda: catches(p.pid, signal.SIGTERM), 60)
            time.sleep(self.rng.uniform(0.0, 1.2))
            sent = time.monotonic()
            p.send_signal(signal.SIGTERM)
            self.finish(p, 120)
            stop = {"signal": "SIGTERM", "phase": "tokenize", "ddp": False, "exit": p.returncode,
                    "seconds": round(time.monotonic() - sent, 3), "hit": hit_of(p.stderr)}
            self.stops.append(stop)
            problems = []
            if p.returncode != 0:
                problems.append(f"exit status {p.returncode}")
            if HEAP_TROUBLE.search(p.stderr):
                problems.append("a heap/sanitizer message")
            if stop["seconds"] > self.a.max_exit_seconds:
                problems.append(f"took {stop['seconds']} s")
            partial = [q.name for q in cache.rglob("*") if ".tmp" in q.name] if cache.exists() else []
            if partial:
                problems.append(f"partial tokenization left: {partial[:3]}")
            if problems:
                self.fail(stop, problems, p.stderr)

    def run(self):
        self.max_steps = self.a.max_steps
        self.args_ = run_args(self.max_steps, self.a.eval_steps, self.a.save_steps)
        ref = self.reference(ddp=False)
        budget = {signal.SIGTERM: self.a.term, signal.SIGINT: getattr(self.a, "int"), signal.SIGKILL: self.a.kill}
        while any(v > 0 for v in budget.values()) and len(self.failures) <= 20:
            per_chain = {s: min(n, self.rng.randint(1, 5)) for s, n in budget.items()}
            for s in budget:
                budget[s] -= per_chain[s]
            self.chain(per_chain, ref)
            # A chain that reached max_steps before its last stop gives the rest back: the counts
            # asked for are the stops made.
            for s in budget:
                budget[s] += per_chain[s]
        if self.a.ddp:
            ref_ddp = self.reference(ddp=True)
            left = self.a.ddp
            while left > 0 and len(self.failures) <= 20:
                n = min(left, 3)
                kills = self.rng.randint(0, min(1, n))
                per_chain = {signal.SIGTERM: n - kills, signal.SIGKILL: kills}
                self.chain(per_chain, ref_ddp, ddp=True)
                left -= n - sum(per_chain.values())
        if self.a.tokenize:
            self.tokenize_stops(self.a.tokenize)
        counts = {}
        for s in self.stops:
            key = f"{s['signal']}{'/ddp' if s['ddp'] else ''}"
            counts[key] = counts.get(key, 0) + 1
        hits, aimed = {}, {}
        for s in self.stops:
            h = s["hit"].split("@")[0]
            hits[h] = hits.get(h, 0) + 1
            aimed[s["phase"]] = aimed.get(s["phase"], 0) + 1
        exit_s = sorted(s["seconds"] for s in self.stops if s["signal"] != "SIGKILL")
        summary = {"stops": counts, "aimed": aimed, "hit": hits, "chains": self.chains, "failures": len(self.failures),
                   "malloc_check": self.a.malloc_check, "build": str(self.a.build_dir),
                   "exit_seconds_median": exit_s[len(exit_s) // 2] if exit_s else None,
                   "exit_seconds_max": exit_s[-1] if exit_s else None}
        print(json.dumps(summary))
        if self.failures:
            (self.work / "failures.json").write_text(json.dumps(self.failures, indent=1))
            print(f"soak: {len(self.failures)} failure(s); details in {self.work / 'failures.json'}", file=sys.stderr)
        elif not self.a.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        return 1 if self.failures else 0


def hit_of(stderr):
    """What the stop line says was interrupted: 'eval@N', 'step', 'between', 'setup', 'tokenize', 'none'."""
    m = re.search(r"during the (?:final )?evaluation at step (\d+)", stderr)
    if m:
        return f"eval@{m.group(1)}"
    if re.search(r"received during step", stderr):
        return "step"
    if "while tokenizing" in stderr or "while preparing the data" in stderr:
        return "tokenize"
    if "no step trained since the start" in stderr:
        return "setup"
    if re.search(r"received at step", stderr):
        return "between"  # between steps: after a log, a save or a rotation
    return "none"


def catches(pid, sig):
    """Whether process `pid` has a handler for `sig` (/proc/PID/status, SigCgt)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except OSError:
        pass
    return False


def worker_pids(launcher_pid):
    """kiln-pretrain processes under a torchrun process."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == launcher_pid and "kiln-pretrain" in (stat.parent / "cmdline").read_text():
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("KILN_BUILD_DIR", ROOT / "build"), type=Path)
    ap.add_argument("--term", type=int, default=8, help="SIGTERM stops")
    ap.add_argument("--int", type=int, default=4, help="SIGINT stops")
    ap.add_argument("--kill", type=int, default=4, help="SIGKILL stops")
    ap.add_argument("--ddp", type=int, default=0, help="stops of one rank of a two-rank Gloo job")
    ap.add_argument("--tokenize", type=int, default=0, help="SIGTERMs during a tokenization")
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--save-steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("KILN_SOAK_SEED", "27")))
    ap.add_argument("--malloc-check", action="store_true", help="glibc malloc checking in every process")
    ap.add_argument("--max-exit-seconds", type=float, default=10.0)
    ap.add_argument("--torchrun", type=Path, default=Path(sys.executable).parent / "torchrun")
    ap.add_argument("--work-dir", default=None, help="where the runs go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders")
    args = ap.parse_args()
    if not (Path(args.build_dir) / "bin" / "kiln-pretrain").exists():
        raise SystemExit(f"soak: no kiln-pretrain under {args.build_dir}/bin")
    if args.ddp and not args.torchrun.exists():
        raise SystemExit(f"soak: --ddp needs torchrun ({args.torchrun})")
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
