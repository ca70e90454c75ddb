#!/usr/bin/env python3
"""The machine code of kiln's CUDA kernels, read on a machine without a GPU and held to goals.

Every kernel source (lib/kiln/kernels/*.cu) is compiled for every architecture kiln builds, and
each kernel's ptxas account (registers, spills, stack, static shared memory) and SASS are read:

  sm_80, sm_90  nvcc 13 (/usr/local/cuda or --nvcc), `-cubin -Xptxas -v`: the code users get.
  sm_70         CUDA 13 no longer targets Volta, so its PTX is made for compute_75 with
                __CUDA_ARCH__ set to 700 (the headers then take their Volta paths), relabelled
                .target sm_70 / .version 8.7 and assembled by CUDA 12.8's ptxas, as a CUDA 12
                build for a V100 would be.
  SASS          cuobjdump + nvdisasm of CUDA 12.8, which read all three architectures.

The CUDA 12.8 ptxas, cuobjdump and nvdisasm are the ones the torch wheel already carries (its
triton package, under triton/backends/nvidia/bin): no other download (docs/kernels.md, "The
machine code, checked"). `--tools DIR` names another directory holding the three.

Per kernel and architecture it reports: registers, spills, stack, shared memory, threads per
block (the kernel's __launch_bounds__, which its launcher uses), resident warps per SM at the
launcher's configuration (registers, shared memory and, where the launcher caps the grid, the
blocks per SM it launches), the global access widths inside the kernel's loops, the bytes one
thread has in flight before it must wait (the most global-load bytes issued and not yet
consumed in the hot loop, read twice so that a load for the next iteration counts), the same per
SM, and the shared-memory accesses inside the hot loop. GOALS below are the rows each kernel must meet; a missed
row fails the check (exit 1). The bytes in flight an SM needs to cover DRAM latency at full
bandwidth (Little's law: bandwidth x loaded latency / SMs) is the goal for memory-bound kernels:
H200 4.8 TB/s x ~700 ns / 132 SMs = 25 KB (sm_90), A100-80GB 2.0 TB/s x ~600 ns / 108 = 11 KB
(sm_80), V100 0.9 TB/s x ~600 ns / 80 = 7 KB (sm_70, 8 KB asked).

  scripts/check_kernel_sass.py                    # all kernels, sm_70/80/90, table to stdout
  scripts/check_kernel_sass.py --only rope,rmsnorm --arch 90
  scripts/check_kernel_sass.py --write-docs       # docs/kernels.md's table, docs/kernel_sass.{md,json}
  scripts/check_kernel_sass.py --self-test        # the SASS readers on hand-written listings first
  scripts/check_kernel_sass.py --nvcc cuda12 --arch 70 --arch 80   # as a CUDA 12 (V100) build compiles them
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "lib" / "kiln" / "kernels"
ARCHS = (70, 80, 90)

# What an SM offers (CUDA C Programming Guide, "Technical Specifications per Compute Capability";
# the tuning guides for the per-block reservation).
SM = {
    70: dict(regs=65536, max_warps=64, max_blocks=32, smem=96 * 1024, reserved=0, reg_unit=256),
    80: dict(regs=65536, max_warps=64, max_blocks=32, smem=164 * 1024, reserved=1024, reg_unit=256),
    90: dict(regs=65536, max_warps=64, max_blocks=32, smem=228 * 1024, reserved=1024, reg_unit=256),
}
# Bytes in flight an SM needs (docstring); the device each architecture is judged by.
NEEDED_KB = {70: 8, 80: 11, 90: 25}
DEVICES = {  # for the predicted fraction of copy bandwidth (kiln-bench --predict reads the JSON)
    "V100-SXM2": dict(arch=70, bandwidth_gbs=900, sms=80, latency_ns=600),
    "A100-SXM4-80GB": dict(arch=80, bandwidth_gbs=2039, sms=108, latency_ns=600),
    "H200": dict(arch=90, bandwidth_gbs=4800, sms=132, latency_ns=700),
}


@dataclasses.dataclass
class Goal:
    """One row: kernels whose short name matches `kernel` (a regex) must meet every set bound.

    A kernel is held to the first row that matches it on its architecture; a row that holds no
    kernel of `source` on one of its architectures (a renamed kernel) is a failure too."""
    kernel: str
    why: str
    op: str | None = None  # kiln-bench's op whose kernels these are (its --predict column)
    source: str = ""  # the kernel source (lib/kiln/kernels/<source>.cu) that must hold such a kernel
    archs: tuple = ARCHS  # the architectures the row applies to
    memory_bound: bool = False  # bytes in flight per SM >= NEEDED_KB[arch]
    max_narrow_in_loops: int | None = None  # global accesses below 128 bits inside loops
    max_shared_in_hot_loop: int | None = None  # LDS/STS/LDSM/ATOMS in the hot loop
    min_warps: int | dict | None = None  # resident warps per SM ({arch: warps} where they differ)
    # Where the launcher caps the grid at N blocks per SM: the constant's name in the source.
    blocks_per_sm_const: str | None = None
    # Tensor-core kernels (ldmatrix + mma.sync; the rows of issue #51), read in the HMMA loop: the
    # innermost loop holding HMMAs (SassFacts.hmma_loop).
    ldsm_operands: bool = False  # every HMMA operand loaded from memory comes from LDSM; no LD (generic), no MOVM
    hmma_span_stores: str | None = None  # between the HMMA loop's first and last HMMA: "none" (no STS)
    #   or "16-bit" (STS.U16, or STS of registers an F2FP packed); either way no LDS of 32 bits or more
    max_insns_per_hmma: float | None = None  # the HMMA loop's static instructions over its HMMAs
    unrolled_hmma_loop: bool = False  # no loop with float math (FMNMX/MUFU/FADD/FMUL/FFMA) inside the HMMA loop

    def warps_for(self, arch: int) -> int | None:
        return self.min_warps.get(arch) if isinstance(self.min_warps, dict) else self.min_warps


# The flash-attention rows of issue #51 (sm_80 and sm_90: ldmatrix and mma.sync; sm_70 runs the WMMA
# kernels, which are held to no spill only). The rules, in the SASS:
#   LDSM: Q, K, V (and the backward's dS, dO) fragments come from shared memory by ldmatrix, never by
#     32-bit LDS (WMMA's load_matrix_sync) or generic loads; no MOVM (a transpose ldmatrix.trans avoids).
#   The HMMA loop's span: S, P and O stay in registers, so between the first and the last HMMA of the
#     hot loop there is no STS and no 32-bit LDS. The backward's dK/dV kernel stores dS to shared
#     memory as 16-bit values by design (FA2 too: dS^T is the A operand of dK += dS^T Q, which needs
#     another thread's fragments): 16-bit stores are allowed there, fp32 round trips are not.
#   <= 8 static instructions per HMMA in the hot loop (the unmasked step; masked tiles run outside it).
#   The softmax fully unrolled: no loop doing float math inside the hot loop. (A loop without float
#     math is allowed: the forward's next_tile() do-while, which skips tiles of other documents.)
#   Resident warps at head_dim 64: 8 on sm_80 (A100: 2 CTAs of 4 warps), 12 on sm_90.
_ATTENTION = dict(source="flash_attention", archs=(80, 90), ldsm_operands=True, max_insns_per_hmma=8,
                  unrolled_hmma_loop=True)
_ATTENTION_D64_WARPS = {80: 8, 90: 12}

# Every kernel: no spill, no stack frame. The memory-bound ones (issue #50) besides:
GOALS = [
    Goal(r"^rope_vec_kernel<", "RoPE, q and k in one launch, 128-bit packs (Liger's layout)", "rope", "rope",
         memory_bound=True, max_narrow_in_loops=0),
    Goal(r"^rmsnorm_fwd_regs_kernel<", "RMSNorm forward, the row in registers (loop-free: the rstd store)", "rmsnorm",
         "rmsnorm", memory_bound=True, max_narrow_in_loops=1),
    Goal(r"^rmsnorm_bwd_regs_kernel<", "RMSNorm backward, dW in registers", "rmsnorm", "rmsnorm", memory_bound=True,
         max_narrow_in_loops=1, max_shared_in_hot_loop=4, min_warps=32, blocks_per_sm_const="kBwdBlocksPerSm"),
    Goal(r"^cross_entropy_fwd_bwd_kernel<.*, true>$", "cross-entropy, 128-bit packs", source="cross_entropy",
         memory_bound=True),
    Goal(r"^swiglu_(fwd|bwd)_kernel<.*, true>$", "SwiGLU, 128-bit packs (the pattern that works)", "swiglu", "swiglu",
         memory_bound=True, max_narrow_in_loops=0),
    # Flash attention on sm_80+ (issue #51; the rules above). head_dim 64 first: it adds the warps.
    Goal(r"^flash_fwd_sm80_kernel<\w+, 64>$", "attention forward (FA2 class), head_dim 64", hmma_span_stores="none",
         min_warps=_ATTENTION_D64_WARPS, **_ATTENTION),
    Goal(r"^flash_fwd_sm80_kernel<", "attention forward (FA2 class)", hmma_span_stores="none", **_ATTENTION),
    Goal(r"^flash_bwd_\w*sm80\w*<\w+, 64\b", "attention backward (FA2 class), head_dim 64: dS stored as 16-bit",
         hmma_span_stores="16-bit", min_warps=_ATTENTION_D64_WARPS, **_ATTENTION),
    Goal(r"^flash_bwd_\w*sm80", "attention backward (FA2 class): dS stored as 16-bit", hmma_span_stores="16-bit",
         **_ATTENTION),
]

# Dynamic shared memory per block, which the launchers pass at launch and the cubin does not
# record: (kernel regex, source, the launcher's C++ constant; {D} is the kernel's second template
# argument, the head dim). The compiler evaluates them (dynamic_smem_values): a probe includes the
# source under the CPU emulation and names each value in a template that it never defines.
DYNAMIC_SMEM = [
    (r"^flash_fwd_sm80_kernel<", "flash_attention", "FwdTile<{D}>::kSmemBytes"),  # launch_fwd_sm80
    (r"^flash_bwd_\w*sm80", "flash_attention", "bwd_sm80_smem_bytes<{D}>()"),  # launch_bwd_sm80
    (r"^flash_fwd_kernel<", "flash_attention", "fwd_smem_bytes<{D}>()"),  # launch_fwd (WMMA)
    (r"^flash_bwd_(dkdv|dq)_kernel<", "flash_attention", "bwd_smem_bytes<{D}>()"),  # launch_bwd (WMMA)
]
HEAD_DIMS = (64, 128)  # flash_attention.cuh: the head dims the kernels are built for


# ---- SASS reading ------------------------------------------------------------------------------

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
REG = re.compile(r"(?<![\w.])R(\d+)(\.64|\.128)?")
GLOBAL_LOAD = re.compile(r"^LDG(\.|$)")
GLOBAL_STORE = re.compile(r"^(STG|RED|ATOMG)(\.|$)")
SHARED = re.compile(r"^(LDS|STS|LDSM|ATOMS)(\.|$)")
NO_DEST = re.compile(r"^(ST[A-Z]*|RED|BAR|BRA|EXIT|RET|CALL|BSSY|BSYNC|WARPSYNC|NOP|MEMBAR|DEPBAR|YIELD|ERRBAR|CCTL)")


@dataclasses.dataclass
class Insn:
    addr: int
    op: str
    args: str
    pred: str = ""  # "@P0", "@!UP1": the guard, if any


def width_bits(op: str) -> int:
    """Access width of a load or store mnemonic (LDG.E.128 -> 128, LDG.E.U16 -> 16, LDG.E -> 32)."""
    for w, bits in ((".128", 128), (".64", 64), (".U16", 16), (".S16", 16), (".U8", 8), (".S8", 8)):
        if w in op:
            return bits
    return 32


def regs_of(token_match) -> list[int]:
    base = int(token_match.group(1))
    n = {".64": 2, ".128": 4}.get(token_match.group(2) or "", 1)
    return list(range(base, base + n))


def parse_sass(text: str) -> dict[str, list[Insn]]:
    """Mangled function name -> its instructions, from `cuobjdump -sass`."""
    funcs: dict[str, list[Insn]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = funcs.setdefault(m.group(1), [])
            continue
        m = INSN.search(line)
        if m and current is not None:
            current.append(Insn(int(m.group(1), 16), m.group(3), m.group(4).strip(), (m.group(2) or "").strip()))
    return funcs


def dest_and_reads(insn: Insn) -> tuple[list[int], list[int]]:
    """Registers an instruction writes and reads (RZ is not a register here)."""
    operands = [o.strip() for o in insn.args.split(",")] if insn.args else []
    dest: list[int] = []
    reads: list[int] = []
    for k, operand in enumerate(operands):
        found = [r for m in REG.finditer(operand) for r in regs_of(m)]
        if k == 0 and not NO_DEST.match(insn.op) and not operand.startswith("[") and found:
            if GLOBAL_LOAD.match(insn.op) or insn.op.startswith(("LDS", "LD.", "LDL")):
                base = int(REG.search(operand).group(1))
                found = list(range(base, base + max(1, width_bits(insn.op) // 32)))
            dest = found
        else:
            reads += found
    return dest, reads


def loops(insns: list[Insn]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of each loop: a branch back to an earlier address."""
    index = {i.addr: k for k, i in enumerate(insns)}
    out = []
    for k, i in enumerate(insns):
        if i.op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", i.args)
            if m and int(m.group(1), 16) <= i.addr and int(m.group(1), 16) in index:
                out.append((index[int(m.group(1), 16)], k))
    return out


def in_flight_bytes(seq: list[Insn]) -> int:
    """The most global-load bytes one thread has issued and not yet used, along `seq`."""
    pending: dict[int, int] = {}  # register -> load id
    size: dict[int, int] = {}  # load id -> bytes
    best = 0
    for n, insn in enumerate(seq):
        dest, reads = dest_and_reads(insn)
        for r in reads + dest:  # reading a load's register (or overwriting it) waits for the load
            if r in pending:
                size.pop(pending[r], None)
                for q in [q for q, lid in pending.items() if lid == pending[r]]:
                    del pending[q]
        if GLOBAL_LOAD.match(insn.op):
            size[n] = width_bits(insn.op) // 8
            for r in dest:
                pending[r] = n
            best = max(best, sum(size.values()))
    return best


@dataclasses.dataclass
class SassFacts:
    narrow_in_loops: int = 0  # global loads/stores below 128 bits inside loops (none there: anywhere)
    global_widths: dict = dataclasses.field(default_factory=dict)  # "LDG.128" -> count, inside loops
    shared_in_hot_loop: int = 0  # LDS/STS/LDSM/ATOMS in the hot loop (below)
    bytes_in_flight: int = 0  # per thread
    has_loops: bool = False


def sass_facts(insns: list[Insn]) -> SassFacts:
    facts = SassFacts()
    spans = loops(insns)
    facts.has_loops = bool(spans)
    inside = set()
    for a, b in spans:
        inside.update(range(a, b + 1))
    # A kernel whose loops move no global data (a row held in registers; a warp-collective retry
    # loop is still a loop): all of it is the hot region.
    if not any(GLOBAL_LOAD.match(insns[k].op) or GLOBAL_STORE.match(insns[k].op) for k in inside):
        inside = set(range(len(insns)))
    for k in sorted(inside):
        i = insns[k]
        if GLOBAL_LOAD.match(i.op) or GLOBAL_STORE.match(i.op):
            key = f"{i.op.split('.')[0]}.{width_bits(i.op)}"
            facts.global_widths[key] = facts.global_widths.get(key, 0) + 1
            facts.narrow_in_loops += width_bits(i.op) < 128
    # The hot loop: of the innermost loops, the one moving the most global bytes per iteration
    # (a vectorised kernel's remainder loop moves fewer). Read twice round, so that a load issued
    # for the next iteration counts. A kernel without loops (a row in registers) is read through.
    def global_bytes(a: int, b: int) -> int:
        return sum(width_bits(i.op) // 8 for i in insns[a:b + 1] if GLOBAL_LOAD.match(i.op) or GLOBAL_STORE.match(i.op))

    innermost = [(a, b) for a, b in spans if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]
    hot = max((s for s in innermost if global_bytes(*s) > 0), key=lambda s: (global_bytes(*s), s[1] - s[0]),
              default=None)
    if hot is None:
        facts.bytes_in_flight = in_flight_bytes(insns)
    else:
        body = insns[hot[0]:hot[1] + 1]
        facts.bytes_in_flight = in_flight_bytes(body + body)
        facts.shared_in_hot_loop = sum(1 for i in body if SHARED.match(i.op))
    return facts


# ---- ptxas -v, ELF attributes and occupancy ---------------------------------------------------


def parse_ptxas(text: str) -> dict[str, dict]:
    rows, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for 'sm_(\d+)'", line)
        if m:
            current = rows.setdefault(m.group(1), dict(regs=0, smem=0, stack=0, spill_st=0, spill_ld=0))
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["regs"] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m:
            current["smem"] = int(m.group(1))
    return rows


def max_threads(elf_text: str) -> dict[str, int]:
    """Mangled name -> __launch_bounds__ threads (EIATTR_MAX_THREADS in the cubin's .nv.info)."""
    out, current, want = {}, None, False
    for line in elf_text.splitlines():
        m = re.match(r"\.nv\.info\.(\S+)", line)
        if m:
            current = m.group(1)
        elif "EIATTR_MAX_THREADS" in line:
            want = True
        elif want and "Value:" in line and current:
            out[current] = int(line.split()[1], 16)
            want = False
    return out


def resident_warps(arch: int, regs: int, threads: int, smem: int, blocks_cap: int | None) -> tuple[int, str]:
    """Warps per SM at this configuration and what limits them."""
    s = SM[arch]
    warps_per_block = (threads + 31) // 32
    regs_per_warp = -(-max(regs, 1) * 32 // s["reg_unit"]) * s["reg_unit"]
    limits = {
        "threads": s["max_warps"] // warps_per_block,
        "blocks": s["max_blocks"],
        "registers": s["regs"] // (regs_per_warp * warps_per_block),
        "shared memory": s["smem"] // (smem + s["reserved"]) if smem + s["reserved"] > 0 else s["max_blocks"],
    }
    if blocks_cap is not None:
        limits["grid"] = blocks_cap
    why = min(limits, key=lambda k: limits[k])
    return limits[why] * warps_per_block, why


# ---- compiling --------------------------------------------------------------------------------


def find_tools(explicit: str | None) -> Path:
    candidates = [explicit] if explicit else []
    python = os.environ.get("KILN_PYTHON")
    home = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln"))
    roots = [Path(python).absolute().parent.parent] if python else []  # the venv, not its base Python
    roots.append(home / "venv")
    for r in roots:
        candidates += glob.glob(str(r / "lib" / "python3*" / "site-packages" / "triton" / "backends" / "nvidia" / "bin"))
    for c in candidates:
        if c and all((Path(c) / t).exists() for t in ("ptxas", "cuobjdump", "nvdisasm")):
            return Path(c)
    raise SystemExit("check_kernel_sass: no CUDA 12.8 ptxas/cuobjdump/nvdisasm: run scripts/setup.sh (the torch "
                     "wheel's triton carries them) or pass --tools DIR")


def run(cmd: list[str], env=None) -> str:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"check_kernel_sass: {' '.join(map(str, cmd[:3]))} ... failed:\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def nvcc_major(nvcc: Path) -> int:
    m = re.search(r"release (\d+)\.", run([nvcc, "--version"]))
    return int(m.group(1)) if m else 13


def compile_one(nvcc: Path, tools: Path, source: Path, arch: int, tmp: Path) -> tuple[str, str, str]:
    """(ptxas -v text, SASS text, cuobjdump -elf text) of one source for one architecture."""
    common = [nvcc, "-std=c++17", "-O3", f"-I{ROOT / 'lib'}", "-Wno-deprecated-gpu-targets"]
    cubin = tmp / f"{source.stem}_{arch}.cubin"
    if arch == 70 and nvcc_major(nvcc) < 13:  # a CUDA 12 nvcc still builds Volta itself
        ptxas = run(common + ["-cubin", "-arch=sm_70", "-Xptxas", "-v", source, "-o", cubin])
    elif arch == 70:
        ptx = tmp / f"{source.stem}_70.ptx"
        run(common + ["-ptx", "-arch=compute_75", "-U__CUDA_ARCH__", "-D__CUDA_ARCH__=700", source, "-o", ptx])
        text = ptx.read_text()
        text = re.sub(r"^\.version \d+\.\d+", ".version 8.7", text, count=1, flags=re.M)
        text = re.sub(r"^\.target sm_75", ".target sm_70", text, count=1, flags=re.M)
        ptx.write_text(text)
        ptxas = run([tools / "ptxas", "-arch=sm_70", "-O3", "-v", ptx, "-o", cubin])
    else:
        ptxas = run(common + ["-cubin", f"-arch=sm_{arch}", "-Xptxas", "-v", source, "-o", cubin])
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    sass = run([tools / "cuobjdump", "-sass", cubin], env=env)
    elf = run([tools / "cuobjdump", "-elf", cubin], env=env)
    return ptxas, sass, elf


def demangle(names: list[str]) -> list[str]:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def short(name: str) -> str:
    """rope_kernel<bf16, true, false> from 'void kiln::kernels::(anonymous namespace)::rope_kernel<...>(...)'."""
    name = name.removeprefix("void ")
    depth, cut = 0, len(name)
    for i, c in enumerate(name):
        depth += c == "<"
        depth -= c == ">"
        if c == "(" and depth == 0 and not name.startswith("(anonymous", i):
            cut = i
            break
    head, _, args = name[:cut].partition("<")
    head = head.split("::")[-1]
    return (head + ("<" + args if args else "")).replace("__nv_bfloat16", "bf16").replace("__half", "fp16") \
        .replace("unsigned int", "u32").replace("long", "i64")


def source_constant(source: Path, name: str) -> int:
    m = re.search(rf"\b{name}\s*=\s*(\d+)\b", source.read_text())
    if not m:
        raise SystemExit(f"check_kernel_sass: {source.name}: no constant {name} (named by a GOALS row)")
    return int(m.group(1))


@dataclasses.dataclass
class Row:
    source: str
    arch: int
    kernel: str
    regs: int
    smem: int
    stack: int
    spills: int
    threads: int
    warps: int
    warp_limit: str
    bytes_per_thread: int
    kb_per_sm: float
    narrow_in_loops: int
    shared_in_hot_loop: int
    widths: str
    goal: str = ""
    op: str | None = None
    misses: list = dataclasses.field(default_factory=list)


def analyse(source: Path, arch: int, ptxas: str, sass: str, elf: str) -> list[Row]:
    acct, funcs, bounds = parse_ptxas(ptxas), parse_sass(sass), max_threads(elf)
    names = sorted(acct)
    rows = []
    for mangled, pretty in zip(names, demangle(names)):
        name = short(pretty)
        a = acct[mangled]
        facts = sass_facts(funcs.get(mangled, []))
        goal = next((g for g in GOALS if re.search(g.kernel, name)), None)
        cap = source_constant(source, goal.blocks_per_sm_const) if goal and goal.blocks_per_sm_const else None
        threads = bounds.get(mangled, 1024)
        warps, limit = resident_warps(arch, a["regs"], threads, a["smem"], cap)
        row = Row(source.name, arch, name, a["regs"], a["smem"], a["stack"], a["spill_st"] + a["spill_ld"], threads,
                  warps, limit, facts.bytes_in_flight, warps * 32 * facts.bytes_in_flight / 1024,
                  facts.narrow_in_loops, facts.shared_in_hot_loop,
                  " ".join(f"{k}x{v}" for k, v in sorted(facts.global_widths.items())))
        if row.spills or row.stack:
            row.misses.append(f"{row.spills} B spilled, {row.stack} B stack")
        if goal:
            row.goal, row.op = goal.why, goal.op
            if goal.memory_bound and row.kb_per_sm < NEEDED_KB[arch]:
                row.misses.append(f"{row.kb_per_sm:.1f} KB in flight per SM < {NEEDED_KB[arch]} KB")
            if goal.max_narrow_in_loops is not None and row.narrow_in_loops > goal.max_narrow_in_loops:
                row.misses.append(f"{row.narrow_in_loops} global accesses < 128 bits in loops "
                                  f"(> {goal.max_narrow_in_loops})")
            if goal.max_shared_in_hot_loop is not None and row.shared_in_hot_loop > goal.max_shared_in_hot_loop:
                row.misses.append(f"{row.shared_in_hot_loop} shared accesses in the hot loop (> {goal.max_shared_in_hot_loop})")
            if goal.min_warps is not None and row.warps < goal.min_warps:
                row.misses.append(f"{row.warps} resident warps per SM < {goal.min_warps}")
        rows.append(row)
    return rows


def markdown(rows: list[Row]) -> str:
    out = ["| kernel | sm | regs | smem B | spill/stack B | threads | warps/SM (limit) | B in flight/thread | "
           "KB in flight/SM | global widths in loops | narrow | shared in hot loop | goal |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in rows:
        verdict = ("MISSED: " + "; ".join(r.misses)) if r.misses else ("met" if r.goal else "no spill")
        out.append(f"| `{r.kernel}` | {r.arch} | {r.regs} | {r.smem} | {r.spills}/{r.stack} | {r.threads} | "
                   f"{r.warps} ({r.warp_limit}) | {r.bytes_per_thread} | {r.kb_per_sm:.1f} | {r.widths or '-'} | "
                   f"{r.narrow_in_loops} | {r.shared_in_hot_loop} | {verdict} |")
    return "\n".join(out) + "\n"


def dtype_of(kernel: str) -> str:
    args = kernel.partition("<")[2]
    return "bf16" if "bf16" in args else "fp16" if "fp16" in args else "fp32"


def headroom(kb_per_sm: float, device: dict) -> float:
    """Bytes in flight per SM over the bytes the device needs in flight (1 or more: latency hidden)."""
    return kb_per_sm * 1024 / (device["bandwidth_gbs"] * 1e9 * device["latency_ns"] * 1e-9 / device["sms"])


def predictions(rows: list[Row]) -> dict:
    """op -> dtype -> device -> headroom of the op's slowest goal kernel (forward or backward) on
    the device's architecture; the predicted fraction of copy bandwidth is min(1, headroom)."""
    out: dict = {}
    for r in rows:
        if not r.op:
            continue
        for name, dev in DEVICES.items():
            if dev["arch"] == r.arch:
                cell = out.setdefault(r.op, {}).setdefault(dtype_of(r.kernel), {})
                cell[name] = round(min(cell.get(name, float("inf")), headroom(r.kb_per_sm, dev)), 3)
    return out


def docs_json(rows: list[Row]) -> str:
    """docs/kernel_sass.json: what kiln-bench --predict reads (embedded at build time)."""
    doc = {
        "generated_by": "scripts/check_kernel_sass.py --write-docs",
        "devices": DEVICES,
        "needed_kb_per_sm": {str(k): v for k, v in NEEDED_KB.items()},
        "headroom": predictions(rows),
        "kernels": [{"op": r.op, "kernel": r.kernel, "arch": r.arch, "dtype": dtype_of(r.kernel),
                     "kb_in_flight_per_sm": round(r.kb_per_sm, 2), "warps_per_sm": r.warps} for r in rows if r.op],
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


BEGIN, END = "<!-- check_kernel_sass.py: begin -->", "<!-- check_kernel_sass.py: end -->"


def docs_block(rows: list[Row]) -> str:
    """docs/kernels.md's generated block: the goals, the predictions and the goal kernels' rows."""
    goals = ["| kernels | what | bytes in flight per SM | narrow global accesses in loops | shared accesses in "
             "the hot loop | resident warps |", "| --- | --- | --- | ---: | ---: | ---: |"]
    for g in GOALS:
        dash = lambda v: "-" if v is None else str(v)  # noqa: E731
        goals.append(f"| `{g.kernel.replace('|', chr(92) + '|')}` | {g.why} | {'>= 8/11/25 KB (sm_70/80/90)' if g.memory_bound else '-'} | "
                     f"{dash(g.max_narrow_in_loops)} | {dash(g.max_shared_in_hot_loop)} | {dash(g.min_warps)} |")
    pred = ["| op | dtype | " + " | ".join(DEVICES) + " |", "| --- | --- |" + " ---: |" * len(DEVICES)]
    for op, by_dtype in sorted(predictions(rows).items()):
        for dtype, cells in sorted(by_dtype.items()):
            pred.append(f"| {op} | {dtype} | " + " | ".join(
                f"{100 * min(1.0, cells[d]):.0f}% ({cells[d]:.1f}x)" if d in cells else "-" for d in DEVICES) + " |")
    return (f"{BEGIN}\n"
            "Goals (every kernel also: no spill, no stack frame):\n\n" + "\n".join(goals) + "\n\n"
            "Predicted fraction of copy bandwidth, min(1, headroom), and in brackets the headroom: bytes in flight\n"
            "per SM over the bytes the device needs in flight (the op's slowest goal kernel):\n\n" + "\n".join(pred) + "\n\n"
            "The goal kernels (every kernel: [kernel_sass.md](kernel_sass.md)):\n\n"
            + markdown([r for r in rows if r.goal]) + f"{END}")


def docs_files(rows: list[Row]) -> dict[Path, str]:
    """Path -> the text this run says it must hold."""
    kernels_md = ROOT / "docs" / "kernels.md"
    text = kernels_md.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"check_kernel_sass: {kernels_md}: no {BEGIN} ... {END} block to fill")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    full = ("# Every kernel's machine code (generated)\n\n"
            "Written by `scripts/check_kernel_sass.py --write-docs`; the CTest entry `kernel_sass` fails when this\n"
            "file no longer matches the sources. docs/kernels.md, \"The machine code, checked\", says how each\n"
            "column is read and holds the goals.\n\n" + markdown(rows))
    return {kernels_md: head + docs_block(rows) + tail, ROOT / "docs" / "kernel_sass.md": full,
            ROOT / "docs" / "kernel_sass.json": docs_json(rows)}


# ---- self-test: the readers on listings whose answers are known ------------------------------

SELF_TEST = """
        Function : _Z1kv
        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.128 R8, desc[UR4][R2.64+0x10] ;
        /*0020*/                   LDG.E R12, desc[UR4][R2.64+0x20] ;
        /*0030*/                   FADD R4, R4, R5 ;
        /*0040*/                   LDS R13, [R0] ;
        /*0050*/                   STG.E.U16 desc[UR4][R2.64], R4 ;
        /*0060*/                   LDG.E.128 R16, desc[UR4][R2.64+0x30] ;
        /*0070*/                   FADD R8, R8, R16 ;
        /*0080*/               @P0 BRA 0x10 ;
        /*0090*/                   EXIT ;
"""


def self_test() -> None:
    insns = parse_sass(SELF_TEST)["_Z1kv"]
    assert len(insns) == 10, len(insns)
    assert dest_and_reads(insns[0]) == ([4, 5, 6, 7], [2, 3])
    assert dest_and_reads(insns[5]) == ([], [2, 3, 4])
    assert loops(insns) == [(1, 8)]
    # straight through: 16 + 16 + 4 in flight before R4 is read
    assert in_flight_bytes(insns) == 36, in_flight_bytes(insns)
    f = sass_facts(insns)
    assert f.global_widths == {"LDG.128": 2, "LDG.32": 1, "STG.16": 1}, f.global_widths
    assert f.narrow_in_loops == 2 and f.shared_in_hot_loop == 1, f
    # the loop read twice: R8's and R12's loads of one pass, the R16 load, then the next pass's
    assert f.bytes_in_flight == 36
    assert resident_warps(90, 32, 256, 0, None) == (64, "threads")
    assert resident_warps(90, 128, 256, 0, None) == (16, "registers")
    assert resident_warps(80, 32, 256, 0, 2) == (16, "grid")
    assert resident_warps(70, 32, 256, 48 * 1024, None) == (16, "shared memory")
    straight = parse_sass(SELF_TEST.replace("@P0 BRA 0x10", "NOP"))["_Z1kv"]
    g = sass_facts(straight)
    assert not g.has_loops and g.narrow_in_loops == 2 and g.global_widths["LDG.128"] == 3, g
    elf = ".nv.info._Z1kv\n\tAttribute:\tEIATTR_MAX_THREADS\n\tFormat:\tEIFMT_SVAL\n\tValue:\t0x100 0x1 0x1 \n"
    assert max_threads(elf) == {"_Z1kv": 256}
    print("check_kernel_sass: self-test passed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, action="append", choices=ARCHS, help="default: 70, 80 and 90")
    ap.add_argument("--only", default="", help="comma list of kernel sources (stems) to check")
    ap.add_argument("--nvcc", default=os.environ.get("CUDACXX") or "/usr/local/cuda/bin/nvcc",
                    help="the nvcc to build with; 'cuda12' fetches CUDA 12 (scripts/fetch_cuda12.sh) and builds "
                         "sm_70 with it directly")
    ap.add_argument("--tools", default=None, help="directory of CUDA 12.8's ptxas, cuobjdump and nvdisasm")
    ap.add_argument("--markdown", default="", help="also write the table to this file")
    ap.add_argument("--write-docs", action="store_true", help="write docs/kernel_sass.{md,json} and docs/kernels.md's table")
    ap.add_argument("--check-docs", action="store_true", help="fail when those two differ from what this run found")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--self-test", action="store_true", help="check the SASS readers, then run")
    args = ap.parse_args()
    if args.self_test:
        self_test()
    tools = find_tools(args.tools)
    if args.nvcc == "cuda12":  # the CUDA 12 toolkit a V100 user builds with (scripts/fetch_cuda12.sh)
        root = run([ROOT / "scripts" / "fetch_cuda12.sh"]).strip().splitlines()[-1]
        args.nvcc = str(Path(root) / "bin" / "nvcc")
    archs = args.arch or list(ARCHS)
    only = {s for s in args.only.split(",") if s}
    sources = [s for s in sorted(KERNELS.glob("*.cu")) if s.stem != "arch_probe" and (not only or s.stem in only)]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        jobs = {(s, a): pool.submit(compile_one, Path(args.nvcc), tools, s, a, Path(tmp)) for s in sources for a in archs}
        for (s, a), job in jobs.items():
            rows += analyse(s, a, *job.result())
    rows.sort(key=lambda r: (r.source, r.kernel, r.arch))
    table = markdown(rows)
    print(table, end="")
    if args.markdown:
        Path(args.markdown).write_text(table)
    docs = docs_files(rows) if args.write_docs or args.check_docs else {}
    stale = []
    for path, text in docs.items():
        if args.write_docs:
            path.write_text(text)
        elif args.check_docs and (not path.exists() or path.read_text() != text):
            stale.append(path.name)
    if stale:
        print(f"check_kernel_sass: {', '.join(stale)} no longer match the kernels: run "
              "scripts/check_kernel_sass.py --write-docs", file=sys.stderr)
    missed = [r for r in rows if r.misses]
    for g in GOALS:
        if not any(re.search(g.kernel, r.kernel) for r in rows) and (not only or any(
                g.kernel.lstrip("^").startswith(s) for s in only)):
            print(f"check_kernel_sass: no kernel matches the goal row {g.kernel!r} ({g.why})", file=sys.stderr)
            missed.append(None)
    if missed or stale:
        print(f"check_kernel_sass: {len(missed)} row(s) missed their goals", file=sys.stderr)
        return 1
    print(f"check_kernel_sass: {len(rows)} kernel builds, every goal met", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
