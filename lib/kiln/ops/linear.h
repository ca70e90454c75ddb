// ops::linear: the decoder's projections, y = x W^T (+ b), with at::linear's semantics under
// autocast, and a faster way to compute a low-precision linear on CPUs that lack AMX tiles.
//
// On such a CPU (AVX-512-BF16 or AVX2 only), oneDNN's bf16 and fp16 GEMMs are slower than MKL's
// fp32 GEMM (measured here on an AVX-512-BF16 machine, docs/benchmarks.md) , yet bf16 autocast
// runs every projection in bf16. With the kiln backend, a linear whose compute dtype is bf16 or
// fp16 (the autocast dtype, or the dtype of both operands without autocast) on such a CPU runs as
// one fp32 GEMM over the operands rounded to the compute dtype, and its result is rounded to it:
// the values a bf16 GEMM with fp32 accumulation produces (the products of two bf16 numbers are
// exact in fp32), up to the order of the sums. Backward does the same for both gradients, which
// autocast's path rounds to the compute dtype too before they reach the fp32 parameter or input.
// The Function saves the input in the compute dtype (as autocast's linear does) and the fp32
// master weight itself, so it holds no low-precision copy of the weight across the step (autocast
// caches one per weight until backward); the rounding of the weight is redone in backward. CUDA,
// AMX CPUs, fp64 and the aten backend call at::linear.
//
// An fp32 linear is at::linear itself. (kiln once sent CPU fp32 GEMMs to oneDNN's matmul through a
// hand-declared ATen internal; oneDNN's JIT fp32 GEMM kernels corrupt the heap when a signal
// arrives while they run, which is how SIGTERM corrupted training runs: docs/training.md,
// "Stopping". Every GEMM here is ATen's public at::mm_out / addmm_.)
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln::ops {

// x [..., in], weight [out, in], bias [out] or undefined. Returns [..., out] in the dtype
// at::linear would return (the autocast dtype under autocast).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// a [M, K] @ b [K, N] for operands of one dtype, with ops::linear's rule: a bf16/fp16 product on
// such a CPU runs as an fp32 GEMM of the widened operands, its result rounded to their dtype;
// anything else is a.mm(b). For code that forms a linear's gradients itself
// (model::LinearImpl::gradients, which selective recomputation calls).
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);

// out = a b, or out += a b with accumulate: a [M, K] and b [K, N] (contiguous or transposed
// views), out [M, N] contiguous, one dtype, one device; at::mm_out / addmm_. It records no
// autograd: for the bodies of autograd Functions and for no-grad code.
void mm_into(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate = false);

// Whether ops::linear with the kiln backend takes the fp32-GEMM path for a CPU linear in `compute`
// (bf16/fp16): not cpu_native_low_precision_gemm(compute), or KILN_CPU_LINEAR_FP32=1/0 (flag).
// The memory model (cost/memory.cpp) gets it through train/kernel_choices.cpp.
bool cpu_linear_uses_fp32_gemm(at::ScalarType compute);

// Whether this CPU's native GEMM in `compute` (oneDNN) is the faster one, by a fixed rule of CPU
// features, never a timing (a resumed run must take the path the first process took):
// - bf16: AMX-BF16 (Intel Sapphire Rapids on), or an AMD CPU with AVX512-BF16 (Zen 4/5). On a
//   Zen 5 VM at 2 threads oneDNN's bf16 GEMM ran 4-5x faster than MKL's fp32 one (811 against 163
//   GFLOP/s at 1024x512x1376), while on an earlier AVX512-BF16 VM without AMX it was slower
//   (9.5 against 6.1 ms); docs/kernels.md.
// - fp16: AMX-BF16 (as before; no CPU here has measured otherwise).
// KILN_CPU_LOW_PRECISION_GEMM=native or fp32 overrides the rule (ops::linear and the loss head).
// Each KILN_* variable here is read through common/env.h when asked (never cached).
bool cpu_native_low_precision_gemm(at::ScalarType compute);

// x86 CPUID: an AMD CPU (vendor "AuthenticAMD") whose leaf 7 subleaf 1 EAX bit 5 says AVX512-BF16.
bool cpu_is_amd_with_avx512_bf16();

// x86 CPUID leaf 7, EDX bit 22: AMX-BF16, the tile unit behind oneDNN's fast bf16 matmuls. True on
// other architectures (keep their native low-precision path: nothing was measured there).
bool cpu_has_amx_bf16();

// The hooks below set the environment variable's override for the process (common/env.h,
// env::set_override), so a test forcing a path and a user setting the variable take one code path.
namespace testing {
// The CPU rule of ops::linear, as KILN_CPU_LINEAR_FP32: -1 = the process environment's (unset:
// cpu_native_low_precision_gemm), 0 = native low-precision GEMM, 1 = fp32 GEMM. For tests that run
// both paths on any machine.
void force_cpu_linear_fp32(int mode);
// cpu_native_low_precision_gemm's answer for every dtype, as KILN_CPU_LOW_PRECISION_GEMM: -1 = the
// process environment's (unset: this CPU's rule), 0 = fp32 is faster (an AVX2 or AVX-512 CPU
// without AMX), 1 = the native bf16/fp16 GEMM is (AMX, Zen 4/5). The rules above it (ops::linear,
// the loss head) follow unless forced themselves. ops/cpu_branches.h sets it with the other CPU rules.
void force_cpu_native_low_precision_gemm(int mode);
}  // namespace testing

}  // namespace kiln::ops
