// ops::linear_cross_entropy: the LM head and its cross-entropy in one op that never holds all
// logits. Rows (tokens) are processed in chunks: logits of a chunk, their log-sum-exp and loss,
// and, when a gradient is wanted, the gradient of those logits (softmax - one_hot) turned at once
// into the chunk's rows of grad(hidden) and added into grad(weight); the chunk's logits are then
// freed. The gradients are computed in the forward pass (as Liger-Kernel does) and scaled by
// grad_output in backward. Memory falls from O(N x V) to O(chunk x V + V x H) on every device:
// the chunked algorithm is written in ATen and is the CPU path too; on CUDA the per-row softmax
// part is one kiln kernel (kernels/cross_entropy.cu) instead of a chain of ATen ops.
//
// Arithmetic: logits in the compute dtype (the autocast dtype when autocast is on, else the
// input dtype, as at::linear would; fp32 on CPUs whose native one is slower, see
// linear_cross_entropy_matmul_dtype), loss and softmax in fp32 (fp64 for fp64 inputs),
// grad(weight) accumulated in fp32 across chunks.
//
// Since the gradient is formed before backward knows grad_output, a bf16/fp16 head rounds it
// before the loss scale and 1 / targets are applied unless the caller says which grad_output to
// expect (LinearCrossEntropyOptions::expected_grad): fp16 then keeps the probabilities below its
// subnormal range that the scaled gradient brings back into it, as the unfused reference does.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace kiln::ops {

enum class LossReduction { kSum, kMean };

// The labels of linear_cross_entropy calls on this thread, while it lives, were checked where
// their batch entered (train::check_host_batch, data::TokenShards::check_ids_below), so the op
// leaves out its own check of device labels: on a GPU that check reads a device value on the host,
// a synchronisation per call. Labels on the CPU are always checked (a host loop, no
// synchronisation). train::TrainingStack::step opens one; nesting is allowed.
class CheckedLabelsScope {
 public:
  CheckedLabelsScope();
  ~CheckedLabelsScope();
  CheckedLabelsScope(const CheckedLabelsScope&) = delete;
  CheckedLabelsScope& operator=(const CheckedLabelsScope&) = delete;
  static bool active();  // on this thread
};

struct LinearCrossEntropyOptions {
  int64_t ignore_index = -100;
  double z_loss = 0.0;       // adds z_loss * logsumexp(logits)^2 per target token (PaLM's z-loss)
  int64_t chunk_tokens = 0;  // rows per chunk; 0 = automatic (see auto_chunk_tokens)
  LossReduction reduction = LossReduction::kMean;
  // The gradient backward is expected to send to `loss_sum` (0-d; the trainer's loss_scale /
  // total_targets), or undefined. With a bf16/fp16 head the chunk's d(loss_sum)/d(logits) is
  // multiplied by it in fp32 and only then rounded to the compute dtype, as autograd through the
  // unfused reference rounds the already scaled gradient; backward then multiplies by
  // grad_output / expected_grad (exactly 1 when the guess was right; still correct when it was
  // not). Read on the device (no host synchronisation). Must be finite and non-zero. fp32/fp64
  // heads ignore it (no narrower rounding to protect).
  at::Tensor expected_grad;
};

struct LinearCrossEntropyResult {
  at::Tensor loss;        // 0-d fp32 (fp64 for fp64 inputs): sum or mean over targets, z-loss included
  at::Tensor loss_sum;    // 0-d: the sum behind `loss` (differentiable too)
  at::Tensor num_tokens;  // 0-d int64: targets != ignore_index
  at::Tensor z_loss_sum;  // 0-d, detached: the z-loss part of loss_sum (0 when z_loss == 0)
};

// hidden: [..., H]; weight: [V, H] (the LM head, y = hidden W^T); labels: [...] integer, the
// target of each row of hidden (already shifted for next-token prediction). Uses the chunked
// algorithm unless backend(Op::kLinearCrossEntropy) is kAten.
LinearCrossEntropyResult linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                              const at::Tensor& labels, const LinearCrossEntropyOptions& options = {});

// The plain ATen composition (full logits, upcast, at::cross_entropy_loss), on any device.
LinearCrossEntropyResult linear_cross_entropy_reference(const at::Tensor& hidden, const at::Tensor& weight,
                                                        const at::Tensor& labels,
                                                        const LinearCrossEntropyOptions& options = {});

// The default rows per chunk, per device.
// CUDA: the largest of 1024 rows, H rounded down to a power of two, and Liger-Kernel's rule
// (about as many logits per chunk as hidden has elements: next_pow2(ceil(rows / ceil(V / H)))),
// at most rows. Every chunk reads and writes the whole fp32 [V, H] weight-gradient sum and reads
// the weight twice whatever its rows: Liger's 256 rows at V 128256, H 2048, 8192 tokens made that
// 32 x 3 GB; 2048 rows make it 4 x 3 GB, and the chunk's bf16 logits (0.5 GB) keep the head's
// modelled peak at 14% of the full-logits head's (docs/kernels.md, "Linear + cross-entropy").
// The cost models take this very function (train/kernel_choices.cpp, KernelChoices::loss_chunk_tokens).
// CPU: the largest power of two with rows x V <= 2^23 logits (32 MiB in fp32), at least 64 rows,
// at most rows. Each chunk adds its [V, H] product into the fp32 weight gradient (reading and
// writing all of it) and runs a dozen ops, each a parallel region; with 64-row chunks
// (Liger's rule for V 32000, H 512, 1024 rows) that cost the CPU 1.6x ATen's full-logits time on
// 2 threads, with 256 rows it is ATen's time (docs/benchmarks.md). Memory stays far below the
// full logits (rows x V x 10+ bytes) either way; the memory model gets the same rule (train/kernel_choices.cpp).
int64_t auto_chunk_tokens(int64_t rows, int64_t vocab, int64_t hidden, bool cpu = false);

// The dtype the head's matmuls run in, given the dtype at::linear would use (`compute`: the
// autocast dtype or the input's). Where ops::cpu_native_low_precision_gemm says the CPU's native
// bf16/fp16 GEMM is the slower one (no AMX tiles and not an AMD AVX512-BF16 CPU: measured on an
// AVX-512-BF16 machine, 256 x 32000 x 512: bf16 175 ms, fp32 112 ms per product, and the bf16
// weight-gradient product also needs an fp32 conversion before it is accumulated) the head runs
// in fp32: faster and more precise, from the fp32 master weight (no low-precision copy of it).
// CUDA, AMX and AMD AVX512-BF16 CPUs keep `compute`. KILN_CPU_HEAD_FP32=0/1 overrides the CPU rule (tests
// and benchmarks use it to run both paths on any machine); the memory model gets this (train/kernel_choices.cpp).
at::ScalarType linear_cross_entropy_matmul_dtype(at::ScalarType compute, bool cpu);

// Whether a chunk's CPU logits of this dtype take the fused fp32 row loop of kernels/cpu_loops.h
// (max, sum of exponentials and the gradient in place over the logits; one [n, V] fp32 buffer per
// chunk) rather than ATen's log_softmax, exp_, mul_ and scatter_add_ (the logits plus an fp32
// log-probability buffer). fp32 and bf16 logits (the bf16 loop computes in fp32 and rounds the
// gradient once to bf16, as ATen's fp32 log-softmax followed by a cast does; the head's bf16 weight
// gradient per chunk then goes into the fp32 sum through kernels::cpu::accumulate_bf16, not a
// mixed-dtype add_ with its fp32 temporary). KILN_CPU_CE_LOOP=0 turns both off (A/B benchmarks);
// The memory model gets this (train/kernel_choices.cpp).
bool cpu_cross_entropy_uses_loop(at::ScalarType logits);

// How a chunk's weight gradient g^T h (g: the chunk's d loss / d logits) goes into the fp32 sum
// over chunks, by the head's matmul dtype and device (docs/kernels.md, "Linear + cross-entropy"):
enum class WeightGradAccumulation {
  kSameDtype,    // the matmul dtype is the sum's (fp32, fp64): mm into it, accumulating from chunk 2
  kOutDtype,     // CUDA bf16/fp16: addmm(sum, g^T, h, out_dtype=fp32, out=sum), cuBLAS's fp32 output
  kUpcast,       // fp32 copies of the chunk's g and h ([n, V] + [n, H]), then an fp32 GEMM into the sum:
                 // CUDA bf16 below sm_80 (ATen refuses a bf16 GEMM with fp32 output there) and CPU fp16
  kCpuBf16Rows,  // CPU bf16 with the fused rows: a bf16 GEMM into one reused buffer, widened into the sum
  kMixedAdd,     // CPU bf16 without them: sum.add_(mm(g^T, h))
};
// `arch`: the CUDA device's compute capability x 10 as the kernels plan for it (ops/cuda_arch.h:
// KILN_KERNEL_ARCH=70 makes an A100/H100 take a V100's path); ignored on the CPU.
WeightGradAccumulation linear_cross_entropy_weight_grad_path(at::ScalarType matmul, bool cuda, int arch);

// The hooks below set the environment variable's override for the process (common/env.h,
// env::set_override), so a test forcing a path and a user setting the variable take one code path.
namespace testing {
// Sends CPU chunks to the ATen ops whatever their dtype (true: KILN_CPU_CE_LOOP=0) or back to the
// process environment's choice (false; unset: the rule above): for tests and benchmarks that
// compare the two.
void force_cpu_cross_entropy_aten(bool on);

// The CPU rule of linear_cross_entropy_matmul_dtype, as KILN_CPU_HEAD_FP32: -1 = the process
// environment's (unset: the rule), 0 = keep the compute dtype, 1 = fp32. For tests that run both
// paths on any machine.
void force_cpu_head_fp32(int mode);
}  // namespace testing

}  // namespace kiln::ops
