#!/usr/bin/env python3
"""Mutation check of the emulated kernel tests: does the suite notice a missing barrier or guard?

Deletes, one at a time, every __syncthreads, __syncwarp and cp.async wait in kiln's CUDA kernel
sources (lib/kiln/kernels/*.cu, the flash-attention .cuh parts and common.cuh) and turns every bounds comparison in their device
code into the constant that lets the guarded access through (`i < n` -> true, `i >= n` -> false).
Each mutant is compiled into the LibTorch-free kernel tests (tests/kernels/test_kernels_strict.cpp
against lib/kiln/kernels/emulation.h) and run:

  1. plain, under the default suite's schedules;
  2. if it survives: built with AddressSanitizer + UBSan;
  3. if it still survives: built with ThreadSanitizer (happens-before across the block's threads).

A mutant is killed by the first that fails (or does not compile, or runs past --timeout). The
report is a Markdown table (every site, what killed it) for docs/kernels.md.

  scripts/check_kernel_mutants.py [--jobs 2] [--only rmsnorm,flash_attention] [--list] [--markdown FILE]
  scripts/check_kernel_mutants.py --only flash_attention_fwd --sites 4,7 --skip-baseline-run

Needs g++, the CUDA toolkit's headers (cuda_bf16.h) and Catch2's header; not LibTorch.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "lib" / "kiln" / "kernels"
SOURCES = ["flash_attention.cu", "flash_attention_fwd.cuh", "flash_attention_bwd.cuh", "rmsnorm.cu", "rope.cu",
           "swiglu.cu", "cross_entropy.cu", "common.cuh"]
# Which emulated translation units include a source, and which test cases exercise it.
USERS = {
    "flash_attention.cu": ["flash_attention"],
    "flash_attention_fwd.cuh": ["flash_attention"],
    "flash_attention_bwd.cuh": ["flash_attention"],
    "rmsnorm.cu": ["rmsnorm"],
    "rope.cu": ["rope"],
    "swiglu.cu": ["swiglu"],
    "cross_entropy.cu": ["cross_entropy"],
    "common.cuh": ["flash_attention", "rmsnorm", "rope", "swiglu", "cross_entropy"],
}
FILTERS = {
    "flash_attention.cu": "[flash]~[slow]",
    "flash_attention_fwd.cuh": "[flash]~[slow]",
    "flash_attention_bwd.cuh": "[flash]~[slow]",
    "common.cuh": "~[slow]",
}
DEFAULT_FILTER = "~[flash]~[slow]"
VARIANTS = {
    "plain": ["-O2"],
    "asan+ubsan": ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"],
    "tsan": ["-O1", "-fsanitize=thread", "-fno-omit-frame-pointer"],
}


@dataclasses.dataclass
class Site:
    file: str
    line: int  # 1-based
    kind: str  # barrier | cp.async wait | guard
    code: str  # the line, stripped
    start: int  # character span in the file's text that the mutant replaces
    end: int
    replacement: str


def code_only(text: str) -> str:
    """The text with comments and string literals blanked (same length, same line breaks)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def device_ranges(code: str) -> list[tuple[int, int]]:
    """Spans of the bodies of __device__ and __global__ functions (and the device struct members)."""
    ranges = []
    for m in re.finditer(r"__(device|global)__", code):
        # The body: the first '{' after the signature (skipping a ';' declaration).
        i = m.end()
        depth_paren = 0
        while i < len(code):
            ch = code[i]
            if ch == "(":
                depth_paren += 1
            elif ch == ")":
                depth_paren -= 1
            elif ch == ";" and depth_paren == 0:
                break
            elif ch == "{" and depth_paren == 0:
                depth, j = 0, i
                while j < len(code):
                    if code[j] == "{":
                        depth += 1
                    elif code[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                ranges.append((i, j))
                break
            i += 1
    return ranges


def for_headers(code: str) -> list[tuple[int, int]]:
    spans = []
    for m in re.finditer(r"\bfor\s*\(", code):
        depth, j = 0, m.end() - 1
        while j < len(code):
            if code[j] == "(":
                depth += 1
            elif code[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        spans.append((m.start(), j))
    return spans


# A comparison operand: an identifier path with member access, indexing, calls and + - * / %
# arithmetic, without a top-level comparison or logical operator.
OPERAND = r"[A-Za-z_][\w.]*(?:\[[^\]]*\]|\([^()]*\))?(?:\s*[-+*/%]\s*[A-Za-z_0-9][\w.]*(?:\[[^\]]*\]|\([^()]*\))?)*"
# Spaces around the operator, as clang-format writes a comparison (never a template's brackets).
COMPARISON = re.compile(rf"({OPERAND})\s+(<=|>=|<|>)\s+({OPERAND})")


def find_sites(name: str) -> list[Site]:
    text = (KERNELS / name).read_text()
    code = code_only(text)
    dev = device_ranges(code)
    fors = for_headers(code)
    in_dev = lambda p: any(a <= p < b for a, b in dev)  # noqa: E731
    in_for = lambda p: any(a <= p < b for a, b in fors)  # noqa: E731
    line_of = lambda p: text.count("\n", 0, p) + 1  # noqa: E731
    line_text = lambda p: text.splitlines()[line_of(p) - 1].strip()  # noqa: E731
    sites: list[Site] = []
    for m in re.finditer(r"\b(__syncthreads|__syncwarp)\s*\(\s*\)\s*;", code):
        if in_dev(m.start()):
            sites.append(Site(name, line_of(m.start()), "barrier", line_text(m.start()), m.start(), m.end(), ";"))
    for m in re.finditer(r"(?:\b\w+::)*\bcp_async_wait\s*<[^;>]*>\s*\(\s*\)\s*;", code):  # tc::cp_async_wait too
        if in_dev(m.start()):
            sites.append(Site(name, line_of(m.start()), "cp.async wait", line_text(m.start()), m.start(), m.end(), ";"))
    for m in COMPARISON.finditer(code):
        start = m.start()
        if not in_dev(start) or in_for(start):
            continue
        left, op, right = m.group(1), m.group(2), m.group(3)
        stmt_start = code.rfind(";", 0, start)
        before = code[max(stmt_start, code.rfind("{", 0, start), code.rfind("}", 0, start)) + 1: start]
        if re.search(r"\b(constexpr|static_assert|template|using)\b", before):
            continue
        # In range: the guard lets the access through; out of range (>=, >): the guard never fires.
        replacement = "true" if op in ("<", "<=") else "false"
        sites.append(Site(name, line_of(start), "guard", line_text(start), start, m.end(), replacement))
    return sorted(sites, key=lambda s: (s.line, s.start))


def compile_objects(out: Path, lib: Path, variant: str, units: list[str], jobs: int) -> str | None:
    """Compiles the emulated units (kernels from `lib`) for a variant; returns an error or None."""
    flags = ["g++", "-std=c++20", *VARIANTS[variant], "-I", str(lib), "-I", str(ROOT / "lib"), "-I",
             str(ROOT / "tests"), "-I", CUDA_INCLUDE]

    def one(unit: str) -> str | None:
        src = ROOT / "tests" / "kernels" / f"{unit}.cpp"
        obj = out / f"{unit}.o"
        r = subprocess.run(flags + ["-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        return None if r.returncode == 0 else f"{unit}: {r.stderr[-2000:]}"

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        errors = [e for e in pool.map(one, units) if e]
    return errors[0] if errors else None


EMULATED_UNITS = [f"{k}_emulated" for k in ("flash_attention", "rmsnorm", "rope", "swiglu", "cross_entropy")]
FIXED_UNITS = ["test_kernels_strict", "test_mma_emulated", "kernel_tests_main"]
CUDA_INCLUDE = ""


def link_and_run(objdir: Path, variant: str, test_filter: str, timeout: int) -> tuple[bool, str]:
    exe = objdir / "kernel_tests"
    objs = [str(p) for p in sorted(objdir.glob("*.o"))]
    r = subprocess.run(["g++", *VARIANTS[variant][1:], *objs, "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0:
        return False, "link: " + r.stderr[-500:]
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1:exitcode=66", ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    try:
        # The sanitizer builds leave out [big] cases, as their CTests do.
        flt = test_filter if variant == "plain" else test_filter + "~[big]"
        r = subprocess.run([str(exe), flt], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout} s"
    if r.returncode == 0:
        return True, ""
    out = r.stdout + r.stderr
    for pat in ("ThreadSanitizer: data race", "AddressSanitizer: [\\w-]+", "runtime error: [^\\n]{0,80}",
                "emulation: [^\\n]{0,100}", "FAILED:[\\s\\S]{0,300}"):
        m = re.search(pat, out)
        if m:
            return False, " ".join(m.group(0).split())[:160]
    return False, f"exit status {r.returncode}"


def main() -> int:
    global CUDA_INCLUDE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", default="", help="comma list of sources (without extension) to mutate")
    ap.add_argument("--list", action="store_true", help="list the mutation sites and stop")
    ap.add_argument("--sites", default="", help="comma list of site numbers (as --list numbers them) to run")
    ap.add_argument("--markdown", default="", help="also write the table to this file")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a mutant's test run may take")
    ap.add_argument("--skip-baseline-run", action="store_true",
                    help="build the unmutated objects but do not run their tests (a run just before passed them)")
    ap.add_argument("--cuda-include", default=os.environ.get("KILN_CUDA_INCLUDE", "/usr/local/cuda/include"))
    args = ap.parse_args()
    CUDA_INCLUDE = args.cuda_include
    if not Path(CUDA_INCLUDE, "cuda_bf16.h").exists():
        print(f"check_kernel_mutants: no cuda_bf16.h under {CUDA_INCLUDE} (--cuda-include)", file=sys.stderr)
        return 2
    only = {o.strip() for o in args.only.split(",") if o.strip()}
    sources = [s for s in SOURCES if not only or s.rsplit(".", 1)[0] in only]
    sites = [s for src in sources for s in find_sites(src)]
    numbered = list(enumerate(sites, 1))
    if args.sites:
        wanted = {int(x) for x in args.sites.split(",") if x.strip()}
        numbered = [(i, s) for i, s in numbered if i in wanted]
    if args.list:
        for i, s in enumerate(sites, 1):
            print(f"{i:3d} {s.file}:{s.line} {s.kind:13s} -> {s.replacement!r:7s} {s.code}")
        return 0

    work = Path(tempfile.mkdtemp(prefix="kiln-mutants-"))
    # The sources as they are now: the sites' positions are in this text, whatever happens to the
    # checkout while the mutants run.
    snapshot = work / "sources"
    shutil.copytree(KERNELS, snapshot)
    try:
        # The unmutated objects of each variant, built once; a mutant rebuilds the units that include its file.
        base = {}
        for variant in VARIANTS:
            d = work / f"base-{variant}"
            d.mkdir()
            base_lib = work / "base" / "lib"
            if not base_lib.exists():
                (base_lib / "kiln").mkdir(parents=True)
                shutil.copytree(snapshot, base_lib / "kiln" / "kernels")
            err = compile_objects(d, base_lib, variant, EMULATED_UNITS + FIXED_UNITS, args.jobs)
            if err:
                print(f"check_kernel_mutants: the unmutated sources do not build ({variant}):\n{err}", file=sys.stderr)
                return 1
            ok, why = (True, "") if args.skip_baseline_run else link_and_run(d, variant, "~[slow]", args.timeout)
            if not ok:
                print(f"check_kernel_mutants: the unmutated tests fail ({variant}): {why}", file=sys.stderr)
                return 1
            base[variant] = d
        print(f"check_kernel_mutants: {len(numbered)} of {len(sites)} mutants; the unmutated tests "
              f"{'were not run (--skip-baseline-run)' if args.skip_baseline_run else 'pass in every variant'}", flush=True)

        rows = []
        for i, s in numbered:
            t0 = time.time()
            lib = work / "mutant" / "lib"
            if lib.parent.exists():
                shutil.rmtree(lib.parent)
            (lib / "kiln").mkdir(parents=True)
            shutil.copytree(snapshot, lib / "kiln" / "kernels")
            text = (snapshot / s.file).read_text()
            (lib / "kiln" / "kernels" / s.file).write_text(text[: s.start] + s.replacement + text[s.end:])
            units = [f"{u}_emulated" for u in USERS[s.file]]
            test_filter = FILTERS.get(s.file, DEFAULT_FILTER)
            verdict = "survived"
            for variant in VARIANTS:
                d = work / "mutant" / variant
                d.mkdir(parents=True)
                for p in base[variant].glob("*.o"):
                    if p.stem not in units:
                        shutil.copy(p, d / p.name)
                err = compile_objects(d, lib, variant, units, args.jobs)
                if err:
                    verdict = "does not compile"
                    break
                ok, why = link_and_run(d, variant, test_filter, args.timeout)
                if not ok:
                    verdict = f"{variant}: {why}"
                    break
            rows.append((i, s, verdict))
            print(f"{i:3d} {s.file}:{s.line} {s.kind} [{time.time() - t0:.0f} s] {verdict}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    killed = sum(1 for _, _, v in rows if v != "survived")
    table = ["| # | site | kind | code | killed by |", "| ---: | --- | --- | --- | --- |"]
    for i, s, v in rows:
        code = s.code.replace("|", "\\|")
        table.append(f"| {i} | `{s.file}:{s.line}` | {s.kind} | `{code}` | {v.replace('|', '/')} |")
    table.append("")
    table.append(f"{killed} of {len(rows)} mutants killed.")
    text = "\n".join(table)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
