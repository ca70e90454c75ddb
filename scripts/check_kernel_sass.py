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
SM, and the shared-memory accesses inside the hot loop. Tensor-core kernels add their HMMA and LDSM
counts and the HMMA loop (the innermost loop holding HMMAs: the attention kernels' unmasked KV
loop) with its static instructions per HMMA; GOALS rows hold them to where HMMA operands come from
(LDSM, not LDS, generic loads or MOVM), the shared-memory traffic between the loop's first and
last HMMA, the instructions per HMMA, no float-math loop inside it, and (with the launchers'
dynamic shared memory, DYNAMIC_SMEM) resident warps. GOALS below are the rows each kernel must meet; a missed
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
    # innermost loop holding HMMAs (tensor_facts).
    ldsm_operands: bool = False  # every HMMA operand loaded from memory comes from LDSM; no LD (generic), no MOVM
    hmma_span_stores: str | None = None  # between the HMMA loop's first and last HMMA: "none" (no STS)
    #   or "16-bit" (STS.U16, or STS of registers an F2FP packed); and at most max_span_lds32 shared
    #   loads (not LDSM) of 32 bits or more there
    max_span_lds32: int = 0
    max_insns_per_hmma: float | None = None  # the HMMA loop's static instructions over its HMMAs
    unrolled_hmma_loop: bool = False  # no loop with float math (FMNMX/MUFU/FADD/FMUL/FFMA) inside the HMMA loop

    def warps_for(self, arch: int) -> int | None:
        return self.min_warps.get(arch) if isinstance(self.min_warps, dict) else self.min_warps


# The flash-attention rows of issue #51 (sm_80 and sm_90: ldmatrix and mma.sync; sm_70 runs the WMMA
# kernels, which are held to no spill only). The rules, in the SASS:
#   LDSM: Q, K, V (and the backward's dS, dO) fragments come from shared memory by ldmatrix, never by
#     32-bit LDS (WMMA's load_matrix_sync) or generic loads; no MOVM (a transpose ldmatrix.trans avoids).
#   The HMMA loop's span: S, P and O stay in registers, so between the first and the last HMMA of the
#     hot loop there is no STS and no LDS of 32 bits or more (an fp32 round trip of S, P or O, as the
#     WMMA kernels make, needs both). The backward differs by design, as FA2's does: the dK/dV kernel
#     stores dS^T to shared memory as 16-bit values for dQ = dS K (another warp's rows, read back by
#     ldmatrix.trans), so 16-bit stores are allowed there and fp32 ones are not; and it reads the
#     query tile's row statistics lse and delta from shared memory (FA2: sLSE, sdPsum), as float2
#     per n8 tile of the 64 queries: 2 x 8 = 16 LDS.64 per step, the bound. A round trip of S^T, P^T
#     or dS^T in fp32 would need fp32 stores in the span and at least 16 more loads.
#   <= 8 static instructions per HMMA in the hot loop (the unmasked step; masked tiles run outside it).
#   The softmax fully unrolled: no loop doing float math inside the hot loop. (A loop without float
#     math is allowed: KeyTileWalk::next()'s do-while, which skips tiles of other documents.)
#   Resident warps at head_dim 64 (registers, __launch_bounds__ threads, dynamic shared memory from
#     DYNAMIC_SMEM): >= 8 on sm_80, >= 12 on sm_90.
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
    Goal(r"^flash_bwd_\w*sm80\w*<\w+, 64\b", "attention backward (FA2 class), head_dim 64: dS^T stored as "
         "16-bit, lse and delta read from shared memory", hmma_span_stores="16-bit", max_span_lds32=16,
         min_warps=_ATTENTION_D64_WARPS, **_ATTENTION),
    Goal(r"^flash_bwd_\w*sm80", "attention backward (FA2 class): dS^T stored as 16-bit, lse and delta read from "
         "shared memory", hmma_span_stores="16-bit", max_span_lds32=16, **_ATTENTION),
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


# ---- tensor cores: the HMMA loop and where HMMA operands come from -----------------------------

HMMA = re.compile(r"^HMMA\.")
LDSM = re.compile(r"^LDSM\.")
GENERIC_LOAD = re.compile(r"^LD(\.|$)")  # LD.E: a generic-address load (global loads are LDG)
MEMORY_LOAD = re.compile(r"^(LD|LDS|LDG|LDL)(\.|$)")  # loads that are not ldmatrix (LDC: constants)
FLOAT_MATH = re.compile(r"^(FMNMX|MUFU|FADD|FMUL|FFMA)(\.|$)")
PACK16 = re.compile(r"^F2FP\.|^F2F\.(F16|BF16)\.")  # 16-bit results (F2FP.BF16.F32.PACK_AB: two in one register)
MOVE = re.compile(r"^(MOV|IMAD\.MOV)(\.|$)")
# Where a register's value may come from: bit masks over the 256 registers, one per class.
FROM_LDSM, FROM_LOAD, FROM_PACK16, FROM_OTHER = range(4)
HEX = re.compile(r"0x([0-9a-f]+)")


def dest_regs(insn: Insn) -> list[int]:
    """The registers an instruction writes, with the widths SASS leaves implicit (LDSM.x4: 4,
    HMMA.16816.F32: 4 accumulators, IMAD.WIDE: 2)."""
    operands = [o.strip() for o in insn.args.split(",")] if insn.args else []
    if not operands or NO_DEST.match(insn.op) or operands[0].startswith("["):
        return []
    m = REG.match(operands[0])
    if not m:
        return []  # a predicate (ISETP P0, ...) or a uniform register
    base = int(m.group(1))
    if LDSM.match(insn.op):
        n = int(insn.op[-1]) if insn.op[-1] in "124" else 1
    elif MEMORY_LOAD.match(insn.op):
        n = max(1, width_bits(insn.op) // 32)
    elif HMMA.match(insn.op):
        n = 4 if ".F32" in insn.op else 2
    elif insn.op.startswith("IMAD.WIDE"):
        n = 2
    else:
        n = len(regs_of(m))
    return list(range(base, base + n))


def hmma_operand_regs(insn: Insn) -> list[int]:
    """An HMMA's A and B registers: m16n8k16 4 + 2, m16n8k8 2 + 1."""
    operands = [o.strip() for o in insn.args.split(",")]
    k16 = insn.op.startswith("HMMA.16816")
    out = []
    for operand, n in ((operands[1], 4 if k16 else 2), (operands[2], 2 if k16 else 1)):
        m = REG.match(operand)
        if m:
            out += range(int(m.group(1)), int(m.group(1)) + n)
    return out


def store_data_regs(insn: Insn) -> list[int]:
    """The registers a store (STS [R3+0x10], R4) writes to memory."""
    operands = [o.strip() for o in insn.args.split(",")]
    m = REG.match(operands[-1]) if operands else None
    return list(range(int(m.group(1)), int(m.group(1)) + max(1, width_bits(insn.op) // 32))) if m else []


def successors(insns: list[Insn], index: dict[int, int], k: int) -> list[int]:
    i = insns[k]
    out = []
    if i.op.startswith("BRA"):
        m = HEX.search(i.args)
        if m and int(m.group(1), 16) in index:
            out.append(index[int(m.group(1), 16)])
    ends = not i.pred and (i.op in ("BRA", "BRA.U", "EXIT") or i.op.startswith(("RET", "BRX", "JMP")))
    if not ends and k + 1 < len(insns):
        out.append(k + 1)
    return out


def reaching_origins(insns: list[Insn]) -> list[tuple[int, int, int, int]]:
    """Per instruction, where each register's value may come from on entry: (LDSM, other
    load, 16-bit pack, other) register masks. Forward data flow over the branches; a guarded
    write may not happen, so it adds its class without clearing the others; moves pass on the
    classes of their source."""
    n = len(insns)
    index = {i.addr: k for k, i in enumerate(insns)}
    succ = [successors(insns, index, k) for k in range(n)]
    dests = [dest_regs(i) for i in insns]
    state: list = [None] * n
    if not n:
        return []
    state[0] = (0, 0, 0, (1 << 256) - 1)
    work = [0]
    while work:
        k = work.pop()
        cls = list(state[k])
        i = insns[k]
        if dests[k] and i.pred != "@!PT":
            if LDSM.match(i.op):
                c = [FROM_LDSM]
            elif MEMORY_LOAD.match(i.op):
                c = [FROM_LOAD]
            elif PACK16.match(i.op):
                c = [FROM_PACK16]
            elif MOVE.match(i.op):
                src = REG.search(i.args.split(",")[-1])
                c = [x for x in range(4) if src and cls[x] >> int(src.group(1)) & 1] or [FROM_OTHER]
            else:
                c = [FROM_OTHER]
            mask = sum(1 << r for r in dests[k] if r < 256)
            for x in range(4):
                if not i.pred:
                    cls[x] &= ~mask
                if x in c:
                    cls[x] |= mask
        out = tuple(cls)
        for s in succ[k]:
            old = state[s]
            new = out if old is None else tuple(a | b for a, b in zip(old, out))
            if new != old:
                state[s] = new
                work.append(s)
    return [st or (0, 0, 0, 0) for st in state]


def loops_by_head(insns: list[Insn]) -> list[tuple[int, int]]:
    """loops(), the back edges to one head taken as one loop (a `continue` is a second back edge)."""
    head: dict[int, int] = {}
    for a, b in loops(insns):
        head[a] = max(head.get(a, b), b)
    return sorted(head.items())


@dataclasses.dataclass
class TensorFacts:
    hmma: int = 0  # in the whole kernel
    ldsm: int = 0
    generic_loads: int = 0  # LD / LD.E.*
    movm: int = 0
    operands_not_ldsm: int = 0  # HMMAs with an A or B register that may come from a load other than LDSM
    loop_insns: int = 0  # the HMMA loop: the innermost loop holding HMMAs (the most HMMAs, if several)
    loop_hmma: int = 0
    span_sts: int = 0  # between the loop's first and last HMMA: stores to shared memory,
    span_sts_wide: int = 0  # of them those that may store other than 16-bit values,
    span_lds32: int = 0  # and shared loads (not ldmatrix) of 32 bits or more
    float_loops_in_loop: int = 0  # loops inside the HMMA loop that do float math

    @property
    def per_hmma(self) -> float:
        return self.loop_insns / self.loop_hmma if self.loop_hmma else 0.0


def tensor_facts(insns: list[Insn], operands: bool = True) -> TensorFacts:
    """The tensor-core readers (Goal's ldsm_operands ... unrolled_hmma_loop); `operands`: also run
    the data flow that traces HMMA operands (the only costly part)."""
    f = TensorFacts()
    f.hmma = sum(1 for i in insns if HMMA.match(i.op))
    if not f.hmma:
        return f
    f.ldsm = sum(1 for i in insns if LDSM.match(i.op))
    f.generic_loads = sum(1 for i in insns if GENERIC_LOAD.match(i.op))
    f.movm = sum(1 for i in insns if i.op.startswith("MOVM"))
    origins = reaching_origins(insns) if operands else []
    if operands:
        not_ldsm = [k for k, i in enumerate(insns) if HMMA.match(i.op)
                    and any(origins[k][FROM_LOAD] >> r & 1 for r in hmma_operand_regs(i))]
        f.operands_not_ldsm = len(not_ldsm)

    def hmmas(a: int, b: int) -> int:
        return sum(1 for i in insns[a:b + 1] if HMMA.match(i.op))

    spans = [s for s in loops_by_head(insns) if hmmas(*s)]
    inner = [(a, b) for a, b in spans if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]
    if not inner:
        return f
    a, b = max(inner, key=lambda s: (hmmas(*s), s[1] - s[0]))
    f.loop_insns, f.loop_hmma = b - a + 1, hmmas(a, b)
    ks = [k for k in range(a, b + 1) if HMMA.match(insns[k].op)]
    for k in range(ks[0], ks[-1] + 1):
        i = insns[k]
        if i.pred == "@!PT":
            continue  # never runs: ptxas's padding (@!PT LDS RZ, [RZ])
        if i.op.startswith(("STS", "ATOMS")):
            f.span_sts += 1
            sixteen = any(w in i.op for w in (".U16", ".S16", ".U8", ".S8")) or (
                operands and i.op.startswith("STS") and store_data_regs(i) and all(
                    not any(origins[k][x] >> r & 1 for x in (FROM_LDSM, FROM_LOAD, FROM_OTHER))
                    for r in store_data_regs(i)))
            f.span_sts_wide += not sixteen
        elif i.op.startswith("LDS") and not LDSM.match(i.op) and width_bits(i.op) >= 32:
            f.span_lds32 += 1
    f.float_loops_in_loop = sum(1 for c, d in loops_by_head(insns) if (c, d) != (a, b) and a <= c and d <= b
                                and any(FLOAT_MATH.match(i.op) for i in insns[c:d + 1]))
    return f


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


def head_dim(kernel: str) -> int | None:
    """The second template argument of flash_fwd_sm80_kernel<bf16, 64>: the head dim."""
    m = re.match(r"[^<]*<[^,<>]+,\s*(\d+)\b", kernel)
    return int(m.group(1)) if m else None


def dynamic_smem_values(sources: list[Path], tmp: Path) -> dict[tuple[int, int], int]:
    """(DYNAMIC_SMEM row, head dim) -> bytes, as the host compiler evaluates the launchers'
    constants: each named in a template that is declared and never defined, whose diagnostic
    then spells the value (a syntax-only pass, about a second)."""
    stems = {s.stem for s in sources}
    wanted = [(n, stem, expr) for n, (_, stem, expr) in enumerate(DYNAMIC_SMEM) if stem in stems]
    if not wanted:
        return {}
    lines = ['#include "kiln/kernels/emulation.h"']
    lines += [f'#include "kiln/kernels/{stem}.cu"' for stem in sorted({w[1] for w in wanted})]
    lines += ["template <int kRow, int kD, unsigned long long kBytes> struct kiln_sass_value;",
              "namespace KILN_KERNELS_NS {", "namespace {"]
    lines += [f"kiln_sass_value<{n}, {d}, ({expr.format(D=d)})> kiln_sass_value_{n}_{d};"
              for n, _, expr in wanted for d in HEAD_DIMS]
    lines += ["}  // namespace", "}  // namespace KILN_KERNELS_NS", ""]
    assert len(wanted) * len(HEAD_DIMS) <= 20, "clang stops after 20 errors: split the probe"
    probe = tmp / "dynamic_smem_probe.cpp"
    probe.write_text("\n".join(lines))
    cxx = os.environ.get("CXX") or "c++"
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-w", f"-I{ROOT / 'lib'}", str(probe)],
                       capture_output=True, text=True)
    found = probe_values(r.stdout + r.stderr)
    missing = [f"{DYNAMIC_SMEM[n][2].format(D=d)}" for n, _, _ in wanted for d in HEAD_DIMS if (n, d) not in found]
    if missing:
        raise SystemExit(f"check_kernel_sass: {cxx} could not evaluate the dynamic shared memory of "
                         f"{', '.join(missing)} (DYNAMIC_SMEM):\n{(r.stdout + r.stderr)[-3000:]}")
    return found


def probe_values(diagnostics: str) -> dict[tuple[int, int], int]:
    """(row, head dim) -> value from the compiler's words on kiln_sass_value<row, D, value>."""
    return {(int(a), int(b)): int(c) for a, b, c in
            re.findall(r"kiln_sass_value<(\d+), (\d+), (\d+)[uUlL]*>", diagnostics)}


def dynamic_smem(source: Path, kernel: str, values: dict[tuple[int, int], int]) -> int:
    """The dynamic shared memory the launcher gives `kernel` (0 where DYNAMIC_SMEM names none)."""
    for n, (pattern, stem, expr) in enumerate(DYNAMIC_SMEM):
        if stem == source.stem and re.search(pattern, kernel):
            d = head_dim(kernel)
            if (n, d) not in values:
                raise SystemExit(f"check_kernel_sass: {kernel}: no value of {expr} for head dim {d} (HEAD_DIMS)")
            return values[(n, d)]
    return 0


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
    dyn_smem: int = 0  # dynamic shared memory per block (DYNAMIC_SMEM); smem is the static part
    tensor: TensorFacts = dataclasses.field(default_factory=TensorFacts)
    goal: str = ""
    goal_index: int | None = None  # GOALS[goal_index] holds this row
    op: str | None = None
    misses: list = dataclasses.field(default_factory=list)


def analyse(source: Path, arch: int, ptxas: str, sass: str, elf: str, dyn_values: dict | None = None) -> list[Row]:
    acct, funcs, bounds = parse_ptxas(ptxas), parse_sass(sass), max_threads(elf)
    names = sorted(acct)
    rows = []
    for mangled, pretty in zip(names, demangle(names)):
        name = short(pretty)
        a = acct[mangled]
        facts = sass_facts(funcs.get(mangled, []))
        gi = next((n for n, g in enumerate(GOALS) if arch in g.archs and re.search(g.kernel, name)), None)
        goal = GOALS[gi] if gi is not None else None
        tensor = tensor_facts(funcs.get(mangled, []), operands=bool(goal and goal.ldsm_operands))
        cap = source_constant(source, goal.blocks_per_sm_const) if goal and goal.blocks_per_sm_const else None
        threads = bounds.get(mangled, 1024)
        dyn = dynamic_smem(source, name, dyn_values or {})
        warps, limit = resident_warps(arch, a["regs"], threads, a["smem"] + dyn, cap)
        row = Row(source.name, arch, name, a["regs"], a["smem"], a["stack"], a["spill_st"] + a["spill_ld"], threads,
                  warps, limit, facts.bytes_in_flight, warps * 32 * facts.bytes_in_flight / 1024,
                  facts.narrow_in_loops, facts.shared_in_hot_loop,
                  " ".join(f"{k}x{v}" for k, v in sorted(facts.global_widths.items())), dyn, tensor)
        if row.spills or row.stack:
            row.misses.append(f"{row.spills} B spilled, {row.stack} B stack")
        if goal:
            row.goal, row.goal_index, row.op = goal.why, gi, goal.op
            row.misses += goal_misses(goal, row)
        rows.append(row)
    return rows


def goal_misses(goal: Goal, row: Row) -> list[str]:
    """The bounds of `goal` that `row` misses."""
    out = []
    arch, t = row.arch, row.tensor
    if goal.memory_bound and row.kb_per_sm < NEEDED_KB[arch]:
        out.append(f"{row.kb_per_sm:.1f} KB in flight per SM < {NEEDED_KB[arch]} KB")
    if goal.max_narrow_in_loops is not None and row.narrow_in_loops > goal.max_narrow_in_loops:
        out.append(f"{row.narrow_in_loops} global accesses < 128 bits in loops (> {goal.max_narrow_in_loops})")
    if goal.max_shared_in_hot_loop is not None and row.shared_in_hot_loop > goal.max_shared_in_hot_loop:
        out.append(f"{row.shared_in_hot_loop} shared accesses in the hot loop (> {goal.max_shared_in_hot_loop})")
    if goal.warps_for(arch) is not None and row.warps < goal.warps_for(arch):
        out.append(f"{row.warps} resident warps per SM < {goal.warps_for(arch)}")
    tensor_rules = goal.ldsm_operands or goal.hmma_span_stores or goal.max_insns_per_hmma or goal.unrolled_hmma_loop
    if tensor_rules and not t.loop_hmma:
        out.append("no loop holds an HMMA" if t.hmma else "no HMMA")
        return out
    if goal.ldsm_operands:
        if not t.ldsm or t.operands_not_ldsm:
            out.append(f"{t.operands_not_ldsm} of {t.hmma} HMMAs take operands loaded otherwise than by LDSM "
                       f"(LDS, LDG, LD, or a spill's LDL; {t.ldsm} LDSM)")
        if t.generic_loads:
            out.append(f"{t.generic_loads} generic loads (LD)")
        if t.movm:
            out.append(f"{t.movm} MOVM")
    if goal.hmma_span_stores is not None:
        stores = t.span_sts if goal.hmma_span_stores == "none" else t.span_sts_wide
        if stores:
            kind = "" if goal.hmma_span_stores == "none" else " of other than 16-bit values"
            out.append(f"{stores} shared stores{kind} between the HMMA loop's first and last HMMA")
        if t.span_lds32 > goal.max_span_lds32:
            out.append(f"{t.span_lds32} shared loads of 32+ bits (not LDSM) between the HMMA loop's first and last "
                       f"HMMA (> {goal.max_span_lds32})")
    if goal.max_insns_per_hmma is not None and t.per_hmma > goal.max_insns_per_hmma:
        out.append(f"{t.loop_insns} instructions / {t.loop_hmma} HMMA = {t.per_hmma:.2f} in the HMMA loop "
                   f"(> {goal.max_insns_per_hmma})")
    if goal.unrolled_hmma_loop and t.float_loops_in_loop:
        out.append(f"{t.float_loops_in_loop} loop(s) doing float math inside the HMMA loop (a per-row loop)")
    return out


def markdown(rows: list[Row]) -> str:
    out = ["| kernel | sm | regs | smem B (static+dynamic) | spill/stack B | threads | warps/SM (limit) | "
           "B in flight/thread | KB in flight/SM | global widths in loops | narrow | shared in hot loop | "
           "HMMA / LDSM | HMMA loop: instr / HMMA | goal |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        verdict = ("MISSED: " + "; ".join(r.misses)) if r.misses else ("met" if r.goal else "no spill")
        smem = f"{r.smem}+{r.dyn_smem}" if r.dyn_smem else f"{r.smem}"
        t = r.tensor
        mma = f"{t.hmma} / {t.ldsm}" if t.hmma else "-"
        loop = f"{t.loop_insns} / {t.loop_hmma} = {t.per_hmma:.2f}" if t.loop_hmma else "-"
        out.append(f"| `{r.kernel}` | {r.arch} | {r.regs} | {smem} | {r.spills}/{r.stack} | {r.threads} | "
                   f"{r.warps} ({r.warp_limit}) | {r.bytes_per_thread} | {r.kb_per_sm:.1f} | {r.widths or '-'} | "
                   f"{r.narrow_in_loops} | {r.shared_in_hot_loop} | {mma} | {loop} | {verdict} |")
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
    goals = ["| kernels | sm | what | bytes in flight per SM | narrow global accesses in loops | shared accesses in "
             "the hot loop | resident warps | tensor cores (HMMA loop) |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | --- |"]
    for g in GOALS:
        dash = lambda v: "-" if v is None else str(v)  # noqa: E731
        warps = dash(g.min_warps)
        if isinstance(g.min_warps, dict):
            warps = (f"{'/'.join(str(g.min_warps[a]) for a in sorted(g.min_warps))} "
                     f"(sm_{'/'.join(str(a) for a in sorted(g.min_warps))})")
        tensor = []
        if g.ldsm_operands:
            tensor.append("operands by LDSM, no LD/MOVM")
        if g.hmma_span_stores:
            stores = "no STS" if g.hmma_span_stores == "none" else f"only {g.hmma_span_stores} STS"
            loads = f"<= {g.max_span_lds32}" if g.max_span_lds32 else "no"
            tensor.append(f"between first and last HMMA {stores}, {loads} LDS of 32+ bits")
        if g.max_insns_per_hmma is not None:
            tensor.append(f"<= {g.max_insns_per_hmma:g} instr/HMMA")
        if g.unrolled_hmma_loop:
            tensor.append("no float-math loop inside")
        sms = "all" if tuple(g.archs) == ARCHS else "/".join(str(a) for a in g.archs)
        goals.append(f"| `{g.kernel.replace('|', chr(92) + '|')}` | {sms} | {g.why} | "
                     f"{'>= 8/11/25 KB (sm_70/80/90)' if g.memory_bound else '-'} | "
                     f"{dash(g.max_narrow_in_loops)} | {dash(g.max_shared_in_hot_loop)} | {warps} | "
                     f"{'; '.join(tensor) or '-'} |")
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


# An attention-like kernel: Q's fragment by LDSM before the loop; in the loop K by LDSM, S = Q K^T,
# softmax math, P packed by F2FP, V by LDSM.trans, O += P V, then a do-while without float math
# (KeyTileWalk::next) and the back edge. 19 instructions, 4 HMMAs.
TENSOR_TEST = """
        Function : _Z2fav
        /*0000*/                   LDSM.16.M88.4 R20, [R2] ;
        /*0010*/                   MOV R30, RZ ;
        /*0020*/                   LDSM.16.M88.4 R24, [R3] ;
        /*0030*/                   HMMA.16816.F32 R4, R20, R24, R4 ;
        /*0040*/                   HMMA.16816.F32 R8, R20, R26, R8 ;
        /*0050*/                   FMNMX R12, R4, R5, !PT ;
        /*0060*/                   FMUL R13, R12, R0 ;
        /*0070*/                   MUFU.EX2 R14, R13 ;
        /*0080*/                   FADD R15, R14, R15 ;
        /*0090*/                   F2FP.F16.F32.PACK_AB R16, R5, R4 ;
        /*00a0*/                   F2FP.F16.F32.PACK_AB R17, R7, R6 ;
        /*00b0*/                   F2FP.F16.F32.PACK_AB R18, R9, R8 ;
        /*00c0*/                   F2FP.F16.F32.PACK_AB R19, R11, R10 ;
        /*00d0*/                   LDSM.16.MT88.4 R24, [R3+0x800] ;
        /*00e0*/              @!PT LDS RZ, [RZ] ;
        /*00f0*/                   HMMA.16816.F32 R32, R16, R24, R32 ;
        /*0100*/                   HMMA.16816.F32 R36, R16, R26, R36 ;
        /*0110*/                   IADD3 R30, R30, 0x1, RZ ;
        /*0120*/                   ISETP.GE.AND P1, PT, R30, R31, PT ;
        /*0130*/              @!P1 BRA 0x110 ;
        /*0140*/               @P0 BRA 0x20 ;
        /*0150*/                   EXIT ;
        /*0160*/                   BRA 0x160 ;
"""


def tensor_self_test() -> None:
    """The tensor-core readers and rules on TENSOR_TEST and variants that each break one rule."""
    def facts(old: str = "", new: str = "", text: str = TENSOR_TEST) -> TensorFacts:
        assert old in text, old
        return tensor_facts(parse_sass(text.replace(old, new) if old else text)["_Z2fav"])

    def misses(f: TensorFacts, **goal) -> list[str]:
        g = Goal("x", "self-test", **{**_ATTENTION, "hmma_span_stores": "none", **goal})
        row = Row("x.cu", 90, "x", 128, 0, 0, 0, 128, 12, "registers", 0, 0.0, 0, 0, "", tensor=f)
        return goal_misses(g, row)

    insns = parse_sass(TENSOR_TEST)["_Z2fav"]
    assert dest_regs(insns[0]) == [20, 21, 22, 23] and dest_regs(insns[3]) == [4, 5, 6, 7]
    assert hmma_operand_regs(insns[4]) == [20, 21, 22, 23, 26, 27] and dest_regs(insns[9]) == [16]
    assert insns[14].pred == "@!PT" and insns[19].pred == "@!P1"
    assert loops_by_head(insns) == [(2, 20), (17, 19), (22, 22)]  # the last: the end's self-branch
    ok = facts()
    assert (ok.hmma, ok.ldsm, ok.loop_insns, ok.loop_hmma, ok.per_hmma) == (4, 3, 19, 4, 4.75), ok
    assert (ok.operands_not_ldsm, ok.span_sts, ok.span_lds32, ok.float_loops_in_loop) == (0, 0, 0, 0), ok
    assert misses(ok) == [] and misses(ok, hmma_span_stores="16-bit") == [], misses(ok)
    # Rule 1: Q by a 32-bit-lane LDS (WMMA's way), before the loop: its two HMMAs.
    f = facts("LDSM.16.M88.4 R20, [R2]", "LDS.128 R20, [R2]")
    assert f.operands_not_ldsm == 2 and f.span_lds32 == 0 and len(misses(f)) == 1, (f, misses(f))
    # ... or loaded for the next pass after the last HMMA: it reaches the HMMAs by the back edge.
    f = facts("IADD3 R30, R30, 0x1, RZ", "LDS.128 R20, [R2]")
    assert f.operands_not_ldsm == 2 and f.span_lds32 == 0 and len(misses(f)) == 1, (f, misses(f))
    # ... through a move still counts; a generic load and a MOVM miss too.
    f = facts("MOV R30, RZ", "MOV R21, R40 ;\n /*0018*/ LDS R40, [R2]").operands_not_ldsm
    assert f == 0, f  # the move reads R40 before the load: not from it
    f = facts("MOV R30, RZ", "LDS R40, [R2] ;\n /*0018*/ MOV R21, R40")
    assert f.operands_not_ldsm == 2, f
    f = facts("LDSM.16.M88.4 R20, [R2]", "LD.E.128 R20, [R2.64]")
    assert f.generic_loads == 1 and f.operands_not_ldsm == 2 and len(misses(f)) == 2, misses(f)
    f = facts("IADD3 R30, R30, 0x1, RZ", "MOVM.16.MT88 R24, R24")
    assert f.movm == 1 and misses(f) == ["1 MOVM"], misses(f)
    # Rule 2: a store between the first and the last HMMA: fp32 (S) fails both modes, a 16-bit
    # pack (F2FP) or STS.U16 only "none"; a 32-bit LDS fails unless the goal allows it.
    f = facts("FADD R15, R14, R15", "STS.64 [R3], R4")
    assert (f.span_sts, f.span_sts_wide) == (1, 1) and misses(f) and misses(f, hmma_span_stores="16-bit"), f
    for store in ("STS [R3], R17", "STS.U16 [R3], R5"):  # after the F2FP packs
        f = facts("@!PT LDS RZ, [RZ]", store)
        assert (f.span_sts, f.span_sts_wide) == (1, 0), (store, f)
        assert misses(f) and not misses(f, hmma_span_stores="16-bit"), (store, misses(f))
    f = facts("FADD R15, R14, R15", "STS [R3], R17")  # R17 before its F2FP: the last pass's pack, or not one
    assert f.span_sts_wide == 1 and misses(f, hmma_span_stores="16-bit"), f
    f = facts("FADD R15, R14, R15", "LDS.64 R14, [R3]")
    assert f.span_lds32 == 1 and misses(f) and not misses(f, max_span_lds32=1), f
    f = facts("FADD R15, R14, R15", "LDS.U16 R14, [R3]")
    assert f.span_lds32 == 0 and not misses(f), f
    # Rule 3: instructions per HMMA in the HMMA loop.
    assert misses(ok, max_insns_per_hmma=4) == ["19 instructions / 4 HMMA = 4.75 in the HMMA loop (> 4)"]
    # Rule 4: a loop doing float math inside the HMMA loop (a per-row loop); integer only is fine.
    f = facts("IADD3 R30, R30, 0x1, RZ", "FADD R29, R29, 1")
    assert f.float_loops_in_loop == 1 and len(misses(f)) == 1, f
    # The HMMA loop is the innermost loop holding HMMAs, not the one around it...
    f = facts("EXIT ;\n        /*0160*/                   BRA 0x160", "@P2 BRA 0x10 ;\n /*0160*/ EXIT")
    assert (f.loop_insns, f.loop_hmma) == (19, 4), f
    # ... and back edges to one head (a `continue`) are one loop.
    f = facts("@!P1 BRA 0x110", "@!P1 BRA 0x20")
    assert (f.loop_insns, f.loop_hmma, f.float_loops_in_loop) == (19, 4, 0), f
    # No loop around the HMMAs: the kernel misses every tensor rule at once.
    f = facts("@P0 BRA 0x20", "NOP")
    assert f.loop_hmma == 0 and misses(f) == ["no loop holds an HMMA"], misses(f)
    # Which row holds which kernel, on which architecture.
    def held(name: str, arch: int) -> str | None:
        return next((g.kernel for g in GOALS if arch in g.archs and re.search(g.kernel, name)), None)
    assert held("flash_fwd_sm80_kernel<bf16, 64>", 90) == GOALS[5].kernel and GOALS[5].warps_for(80) == 8
    assert held("flash_fwd_sm80_kernel<fp16, 128>", 80) == GOALS[6].kernel and GOALS[6].warps_for(90) is None
    assert held("flash_bwd_dkdv_sm80_kernel<bf16, 64, true>", 80) == GOALS[7].kernel
    assert held("flash_bwd_dq_sm80_kernel<fp16, 128>", 90) == GOALS[8].kernel
    assert held("flash_fwd_sm80_kernel<fp16, 64>", 70) is None and held("flash_fwd_kernel<fp16, 64, false>", 90) is None
    assert held("flash_bwd_dkdv_kernel<fp16, 64, true, false>", 80) is None
    # Dynamic shared memory: the head dim, and the values the compiler spells (gcc, clang).
    assert head_dim("flash_fwd_sm80_kernel<bf16, 64>") == 64
    assert head_dim("flash_bwd_dq_sm80_kernel<fp16, 128, true>") == 128
    assert probe_values("error: aggregate 'kiln_sass_value<0, 64, 24576> kiln_sass_value_0_64' has incomplete type\n"
                        "error: implicit instantiation of undefined template 'kiln_sass_value<1, 128, 49152ul>'") \
        == {(0, 64): 24576, (1, 128): 49152}
    assert resident_warps(90, 168, 128, 24576, None) == (12, "registers")
    assert resident_warps(80, 64, 128, 98304, None) == (4, "shared memory")


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
    tensor_self_test()
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
        dyn_job = pool.submit(dynamic_smem_values, sources, Path(tmp))
        jobs = {(s, a): pool.submit(compile_one, Path(args.nvcc), tools, s, a, Path(tmp)) for s in sources for a in archs}
        for (s, a), job in jobs.items():
            rows += analyse(s, a, *job.result(), dyn_job.result())
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
    # A row that holds no kernel (a renamed kernel would escape it) fails, per architecture it applies to.
    stems = {s.stem for s in sources}
    for n, g in enumerate(GOALS):
        for a in [a for a in archs if a in g.archs and g.source in stems]:
            if not any(r.goal_index == n and r.arch == a for r in rows):
                print(f"check_kernel_sass: no {g.source}.cu kernel on sm_{a} is held to the goal row {g.kernel!r} "
                      f"({g.why})", file=sys.stderr)
                missed.append(None)
    if missed or stale:
        print(f"check_kernel_sass: {len(missed)} row(s) missed their goals", file=sys.stderr)
        return 1
    print(f"check_kernel_sass: {len(rows)} kernel builds, every goal met", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
