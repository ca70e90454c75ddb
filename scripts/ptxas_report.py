#!/usr/bin/env python3
"""Compiles every kiln kernel source (lib/kiln/kernels/*.cu) for the given GPU architectures and
prints ptxas's account of each kernel: registers per thread, static shared memory, stack, spill
stores and loads, as a Markdown table (docs/kernels.md, "Register and spill counts").

The kernels are torch-free, so any nvcc compiles them alone. By default the CUDA 12 toolkit of
scripts/fetch_cuda12.sh (fetched when missing), since CUDA 13 no longer targets sm_70:

  scripts/ptxas_report.py                       # sm_70 and sm_80 with the CUDA 12 toolkit
  scripts/ptxas_report.py --nvcc /usr/local/cuda/bin/nvcc --arch 80 --arch 90

Exit status 1 when a kernel fails to compile or spills (a spill is worth knowing before a GPU is).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = sorted((ROOT / "lib" / "kiln" / "kernels").glob("*.cu"))


def default_nvcc():
    home = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln"))
    nvcc = home / "cuda-12" / "bin" / "nvcc"
    if not nvcc.exists():
        subprocess.run([str(ROOT / "scripts" / "fetch_cuda12.sh")], check=True, stdout=subprocess.DEVNULL)
    return nvcc


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def short(name):
    """flash_fwd_kernel<fp16, 64, false> from 'void kiln::kernels::(anon)::flash_fwd_kernel<__half, 64, false>(...)'."""
    name = name.removeprefix("void ")
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # the parameter list: the first '(' outside template brackets
        depth += c == "<"
        depth -= c == ">"
        if c == "(" and depth == 0 and not name.startswith("(anonymous", i):
            cut = i
            break
    name = name[:cut]
    head, _, args = name.partition("<")
    head = head.split("::")[-1]
    return (head + ("<" + args if args else "")).replace("__nv_bfloat16", "bf16").replace("__half", "fp16")


def compile_one(nvcc, source, arch, tmp):
    cmd = [str(nvcc), "-std=c++17", "-O3", f"-I{ROOT / 'lib'}", "-c", str(source), "-o", str(Path(tmp) / "k.o"),
           "-gencode", f"arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v", "-Wno-deprecated-gpu-targets"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{source.name} for sm_{arch}: nvcc failed\n{r.stderr[-3000:]}")
    rows, current = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for 'sm_(\d+)'", line)
        if m:
            current = m.group(1)
            rows[current] = {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0}
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            rows[current].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers(?:, (\d+) bytes smem)?", line)
        if m:
            rows[current].update(regs=int(m.group(1)), smem=int(m.group(2) or 0))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc", type=Path, default=None)
    ap.add_argument("--arch", action="append", type=int, help="compute capability x10 (repeatable; default 70, 80)")
    args = ap.parse_args()
    nvcc = args.nvcc or default_nvcc()
    archs = args.arch or [70, 80]
    version = re.search(r"release ([\d.]+)", subprocess.run([str(nvcc), "--version"], capture_output=True,
                                                              text=True).stdout).group(1)
    table, spills = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for source in KERNELS:
            for arch in archs:
                rows = compile_one(nvcc, source, arch, tmp)
                names = demangle(list(rows))
                for mangled, name in zip(rows, names):
                    r = rows[mangled]
                    table.append((source.name, short(name), arch, r))
                    if r["spill_st"] or r["spill_ld"]:
                        spills.append(f"{short(name)} sm_{arch}")
    print(f"ptxas of nvcc {version} (-O3), per kernel and architecture: registers per thread, static shared "
          f"memory, stack frame, spill stores / loads (bytes)\n")
    print("| source | kernel | arch | registers | static smem | stack | spills (st / ld) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    traps = 0
    for source, name, arch, r in sorted(table, key=lambda t: (t[0], t[1], t[2])):
        if r["regs"] <= 4 and r["smem"] == 0 and "flash" in name:
            traps += 1  # a variant this architecture does not run (flash_attention.cu: variant_compiled)
            continue
        print(f"| {source} | `{name}` | sm_{arch} | {r['regs']} | {r['smem']} | {r['stack']} | "
              f"{r['spill_st']} / {r['spill_ld']} |")
    print(f"\n({traps} flash-attention instantiations compile to a trap on an architecture that never runs them: "
          f"bf16 and the cp.async variants on sm_70.)")
    if spills:
        print(f"\nspills: {', '.join(spills)}", file=sys.stderr)
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
