#!/usr/bin/env python3
"""Times README.md's two commands from a clean clone with an empty compiler cache.

    python3 scripts/time_quickstart.py [--ref COMMIT]... [--then-test] [--keep DIR]

(e.g. --ref HEAD --ref <older commit> --then-test: the ratio printed is first / second)

For each --ref (default: HEAD), in the order given: `git clone` of this repository at that commit
into a fresh folder, a fresh empty ccache (CCACHE_DIR in that folder), then `scripts/quickstart.sh`
with its output time-stamped line by line. LibTorch is whatever the machine's set-up already has
(KILN_HOME is shared, as a user's second clone would find it). Reported per commit:

  first log line   seconds from the start to kiln-pretrain's first line (its banner's "*****" line
                   or the first line after the build's last "[n/m]" line that is not set-up/CMake)
  quickstart       seconds to the end of the quickstart (the sample printed)
  test command     with --then-test, for the first commit: seconds of `scripts/test.sh` run, after
                   every quickstart, in that commit's clone (what its quickstart built reused),
                   and its result

Prints one Markdown table at the end (docs/architecture.md, "Build targets and the quickstart").
Run it on an otherwise idle machine: the figures are wall-clock times.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = re.compile(r"^(\[setup\]|\[quickstart\]|-- |\[\d+/\d+\]|CMake |ninja:|\s|In file included|/|\.\./|"
                   r"Call Stack|  |Consolidate|Configuring|Generating|Build files)")


def run_timed(cmd, cwd, env, log_path, first_line_pattern=None):
    """Runs cmd, time-stamps its lines into log_path; returns (rc, total seconds, first-line seconds)."""
    t0 = time.monotonic()
    first = None
    seen_build_end = False
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace")
        for line in p.stdout:
            t = time.monotonic() - t0
            log.write(f"{t:9.1f} {line}")
            if first_line_pattern is None or first is not None:
                continue
            if line.startswith("*****") or (seen_build_end and not NOISE.match(line) and line.strip()):
                first = t
            if re.match(r"^\[(\d+)/\1\]", line) or "no work to do" in line:
                seen_build_end = True
        rc = p.wait()
    return rc, time.monotonic() - t0, first


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", action="append", help="commit to time (repeatable; default HEAD)")
    ap.add_argument("--then-test", action="store_true", help="then run scripts/test.sh in the first commit's clone")
    ap.add_argument("--keep", help="folder for the clones and logs (default: a temporary one, removed)")
    ap.add_argument("--quickstart-args", default="", help="arguments for kiln-pretrain, e.g. '--max_steps 100'")
    a = ap.parse_args()
    refs = a.ref or ["HEAD"]
    work = a.keep or tempfile.mkdtemp(prefix="kiln-time-")
    os.makedirs(work, exist_ok=True)
    rows = []
    try:
        for ref in refs:
            sha = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", ref], text=True).strip()
            clone = os.path.join(work, f"clone-{sha}")
            shutil.rmtree(clone, ignore_errors=True)
            subprocess.check_call(["git", "clone", "-q", "--no-local", ROOT, clone])
            subprocess.check_call(["git", "-C", clone, "checkout", "-q", sha])
            env = dict(os.environ)
            env["CCACHE_DIR"] = os.path.join(work, f"ccache-{sha}")
            shutil.rmtree(env["CCACHE_DIR"], ignore_errors=True)
            env.pop("KILN_BUILD_DIR", None)
            log = os.path.join(work, f"quickstart-{sha}.log")
            print(f"[time_quickstart] {sha}: quickstart (log {log})", flush=True)
            rc, total, first = run_timed(["scripts/quickstart.sh", *a.quickstart_args.split()], clone, env, log, True)
            rows.append({"ref": sha, "first": first, "quickstart": total, "rc": rc, "clone": clone, "env": env})
            print(f"[time_quickstart] {sha}: first log line {first}, quickstart {total:.0f} s, exit {rc}", flush=True)
        r = rows[0]
        if a.then_test and r["rc"] == 0:
            tlog = os.path.join(work, f"test-{r['ref']}.log")
            print(f"[time_quickstart] {r['ref']}: test command (log {tlog})", flush=True)
            trc, ttotal, _ = run_timed(["scripts/test.sh"], r["clone"], r["env"], tlog)
            r.update(test=ttotal, test_rc=trc)
            print(f"[time_quickstart] {r['ref']}: test command {ttotal:.0f} s, exit {trc}", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    def s(x):
        return "n/a" if x is None else f"{x:.0f}"

    print(f"\nMachine: {os.cpu_count()} CPUs; empty ccache per commit; LibTorch from the machine's set-up.\n")
    print("| commit | first log line (s) | quickstart (s) | test command (s) | result |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in rows:
        res = "ok" if r["rc"] == 0 else f"quickstart exit {r['rc']}"
        if "test_rc" in r:
            res += ", tests passed" if r["test_rc"] == 0 else f", tests exit {r['test_rc']}"
        print(f"| {r['ref']} | {s(r['first'])} | {s(r['quickstart'])} | {s(r.get('test'))} | {res} |")
    if len(rows) >= 2 and all(r["first"] for r in rows):
        print(f"\nfirst log line, {rows[0]['ref']} / {rows[1]['ref']}: {rows[0]['first'] / rows[1]['first']:.2f}")
    return 0 if all(r["rc"] == 0 and r.get("test_rc", 0) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
