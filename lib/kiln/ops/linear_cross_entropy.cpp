// The chunk loop, the autograd Function and the reference of ops::linear_cross_entropy. The
// per-chunk softmax step is the only part with two implementations: ATen ops (any device) or the
// kiln CUDA kernel; the matmuls are cuBLAS/MKL either way.
#include "kiln/ops/linear_cross_entropy.h"

#include <algorithm>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include "kiln/common/env.h"
#include "kiln/kernels/cpu_loops.h"
#include "kiln/ops/autocast_off.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"

namespace kiln::ops {

#ifdef KILN_WITH_CUDA
// ops/linear_cross_entropy_cuda.cpp: the kernel on one chunk. logits [n, V] contiguous, in place.
// grad_scale: undefined, or a 0-d fp32 tensor on the logits' device that multiplies the gradient
// before it is rounded.
void cross_entropy_chunk_cuda(at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index, double z_loss,
                              bool write_grad, const at::Tensor& grad_scale, at::Tensor& loss, at::Tensor& lse);
bool cross_entropy_cuda_applies(const at::Tensor& logits);
// The compute capability x 10 the kernels plan for on this device (ops/cuda_arch.h).
int cuda_planned_arch(const c10::Device& device);
#endif

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// loss [n], lse [n] in the accumulation dtype; with write_grad, d(loss)/d(logits) in the compute
// dtype, times grad_scale (0-d fp32 on the device, or undefined: 1) before it was rounded.
struct ChunkResult {
  at::Tensor loss, lse, grad;
};

// Whether no CPU label is ignore_index, read through the pointer: an ATen reduction and item()
// would be a host read of a tensor's value, which a step never makes (on a GPU each is a wait;
// the step tests count them on the CPU too, tests/train/test_training_step.cpp).
bool all_targets_valid(const at::Tensor& labels, int64_t ignore_index) {
  const at::Tensor y = labels.to(at::kLong).contiguous();
  const int64_t* p = y.const_data_ptr<int64_t>();
  return std::none_of(p, p + y.numel(), [&](int64_t v) { return v == ignore_index; });
}

ChunkResult chunk_aten(at::Tensor logits, const at::Tensor& labels, int64_t ignore_index, double z_loss,
                       bool write_grad, const at::Tensor& grad_scale, at::ScalarType acc) {
  const at::ScalarType compute = logits.scalar_type();
  const bool cuda = logits.is_cuda();
  const at::Tensor valid = labels.ne(ignore_index);
  const at::Tensor valid_acc = valid.to(acc);
  const at::Tensor safe = at::where(valid, labels, at::zeros_like(labels)).unsqueeze(1);  // [n, 1]
  // One fused log-softmax (max, sum of exponentials, write: ATen's vectorised kernel) instead of
  // logsumexp + gather + subtract + exp: fewer passes over the [n, V] chunk (docs/benchmarks.md).
  at::Tensor logp = at::log_softmax(logits, 1, acc);                           // [n, V] in fp32
  const at::Tensor nll = logp.gather(1, safe).squeeze(1).neg();                // -log p(target)
  const at::Tensor lse = logits.gather(1, safe).squeeze(1).to(acc).add_(nll);  // x[target] + nll
  logits = at::Tensor();
  ChunkResult r;
  r.lse = lse;
  r.loss = (nll + lse.square() * z_loss) * valid_acc;
  if (!write_grad) return r;
  // softmax * (1 + 2 z lse) - one_hot, in place over the fp32 log-probabilities; zero rows for
  // ignored targets (on the CPU the row scale is skipped when it is all ones; asking would make
  // CUDA wait).
  at::Tensor x = logp.exp_();
  if (z_loss != 0 || cuda || !all_targets_valid(labels, ignore_index))
    x.mul_(((lse * (2 * z_loss) + 1) * valid_acc).unsqueeze(1));
  x.scatter_add_(1, safe, valid_acc.neg().unsqueeze(1));
  if (grad_scale.defined()) x.mul_(grad_scale);  // before the rounding to the compute dtype
  r.grad = x.to(compute);
  return r;
}

// fp32 logits on the CPU: kernels/cpu_loops.h's fused row loop (max, sum of exponentials, the
// gradient written over the logits: three passes over a row held in cache, no [n, V] buffer
// besides the logits) instead of log_softmax + exp_ + mul_ + scatter_add_.
// bf16 logits: the same loop in fp32 arithmetic, the gradient rounded once to bf16 in place.
ChunkResult chunk_cpu_loop(at::Tensor logits, const at::Tensor& labels, int64_t ignore_index, double z_loss,
                           bool write_grad, const at::Tensor& grad_scale) {
  // A 0-d fp32 CPU tensor, read through its pointer (item() would count as a host read).
  const float scale = grad_scale.defined() ? *grad_scale.to(at::kFloat).contiguous().const_data_ptr<float>() : 1.0f;
  const int64_t n = logits.size(0), vocab = logits.size(1);
  ChunkResult r;
  r.loss = at::empty({n}, logits.options().dtype(at::kFloat));
  r.lse = at::empty({n}, logits.options().dtype(at::kFloat));
  if (logits.scalar_type() == at::kBFloat16) {
    kernels::cpu::cross_entropy_rows_bf16(reinterpret_cast<uint16_t*>(logits.mutable_data_ptr<at::BFloat16>()),
                                          labels.const_data_ptr<int64_t>(), ignore_index, static_cast<float>(z_loss),
                                          r.loss.mutable_data_ptr<float>(), r.lse.mutable_data_ptr<float>(), n, vocab,
                                          write_grad, scale);
  } else {
    kernels::cpu::cross_entropy_rows(logits.mutable_data_ptr<float>(), labels.const_data_ptr<int64_t>(), ignore_index,
                                     static_cast<float>(z_loss), r.loss.mutable_data_ptr<float>(),
                                     r.lse.mutable_data_ptr<float>(), n, vocab, write_grad, scale);
  }
  if (write_grad) r.grad = std::move(logits);
  return r;
}

ChunkResult chunk_dispatch(at::Tensor logits, const at::Tensor& labels, int64_t ignore_index, double z_loss,
                           bool write_grad, const at::Tensor& grad_scale, at::ScalarType acc) {
#ifdef KILN_WITH_CUDA
  if (logits.is_cuda() && backend(Op::kLinearCrossEntropy) == Backend::kKiln && cross_entropy_cuda_applies(logits)) {
    ChunkResult r;
    cross_entropy_chunk_cuda(logits, labels, ignore_index, z_loss, write_grad, grad_scale, r.loss, r.lse);
    if (write_grad) r.grad = logits;
    return r;
  }
#endif
  if (logits.is_cpu() && cpu_cross_entropy_uses_loop(logits.scalar_type()) && logits.is_contiguous() &&
      labels.scalar_type() == at::kLong && labels.is_contiguous()) {
    return chunk_cpu_loop(std::move(logits), labels, ignore_index, z_loss, write_grad, grad_scale);
  }
  return chunk_aten(std::move(logits), labels, ignore_index, z_loss, write_grad, grad_scale, acc);
}

// grad_hidden [N, H] and grad_weight [V, H] are filled when with_grad (the gradients of loss_sum
// times grad_scale when it is defined); returns {loss_sum, z_sum}.
std::pair<at::Tensor, at::Tensor> chunked_pass(const at::Tensor& hidden, const at::Tensor& weight,
                                               const at::Tensor& labels, int64_t ignore_index, double z_loss,
                                               int64_t chunk, bool with_grad, const at::Tensor& grad_scale,
                                               at::Tensor* grad_hidden, at::Tensor* grad_weight) {
  const int64_t rows = hidden.size(0);
  const at::ScalarType acc = at::promote_types(hidden.scalar_type(), at::kFloat);
  at::Tensor loss_sum = at::zeros({}, hidden.options().dtype(acc));
  at::Tensor z_sum = at::zeros({}, hidden.options().dtype(acc));
  at::Tensor grad_w_acc;
  int arch = 0;
#ifdef KILN_WITH_CUDA
  if (hidden.is_cuda() && with_grad) arch = cuda_planned_arch(hidden.device());
#endif
  using Path = WeightGradAccumulation;
  const Path path = linear_cross_entropy_weight_grad_path(hidden.scalar_type(), hidden.is_cuda(), arch);
  // Same dtype and the fp32 copies: the first chunk's product is written into the accumulator (no
  // zero fill of the [V, H] fp32 buffer, one pass over 65 MB fewer at V 32000, H 512); the others
  // add into it. CPU bf16 with the rows: each chunk's bf16 weight gradient goes into one reused
  // bf16 buffer and is widened into the fp32 sum by a loop (a mixed-dtype add_ would allocate an
  // fp32 [V, H] copy per chunk, and its page faults cost more than the add); the first chunk's is
  // widened into it. out_dtype and the mixed add start from a zero-filled sum.
  at::Tensor dw_chunk;
  if (with_grad) {
    *grad_hidden = at::empty_like(hidden);
    const bool written_first = path == Path::kSameDtype || path == Path::kUpcast || path == Path::kCpuBf16Rows;
    grad_w_acc = written_first ? at::empty(weight.sizes(), weight.options().dtype(acc))
                               : at::zeros(weight.sizes(), weight.options().dtype(acc));
    if (path == Path::kCpuBf16Rows) dw_chunk = at::empty(weight.sizes(), weight.options());
  }
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    const at::Tensor h = hidden.narrow(0, start, n);  // [n, H]
    const at::Tensor y = labels.narrow(0, start, n);  // [n]
    at::Tensor logits = at::empty({n, weight.size(0)}, hidden.options());
    mm_into(logits, h, weight.t());
    ChunkResult r = chunk_dispatch(std::move(logits), y, ignore_index, z_loss, with_grad, grad_scale, acc);
    loss_sum.add_(r.loss.to(acc).sum());
    if (z_loss != 0) z_sum.add_((r.lse.to(acc).square() * y.ne(ignore_index).to(acc)).sum() * z_loss);
    if (!with_grad) continue;
    at::Tensor gh = grad_hidden->narrow(0, start, n);
    mm_into(gh, r.grad, weight);  // [n, V] x [V, H]
    switch (path) {
      case Path::kSameDtype:
        mm_into(grad_w_acc, r.grad.t(), h, /*accumulate=*/start != 0);
        break;
      case Path::kOutDtype:
        // bf16/fp16 operands, fp32 output, `self` the fp32 sum itself (beta 1), which torch 2.10.0
        // and 2.11.0 accept (docs/kernels.md, "Known limits"); no fp32 copy of anything.
        at::addmm_out(grad_w_acc, grad_w_acc, r.grad.t(), h, acc);
        break;
      case Path::kUpcast:
        // The chunk's operands in fp32 (the GEMM's own inputs are these values exactly), one fp32 GEMM.
        mm_into(grad_w_acc, r.grad.t().to(acc), h.to(acc), /*accumulate=*/start != 0);
        break;
      case Path::kCpuBf16Rows:
        at::mm_out(dw_chunk, r.grad.t(), h);  // bf16 x bf16 (oneDNN), rounded to bf16 as autocast's
        if (start == 0) {
          grad_w_acc.copy_(dw_chunk);
        } else {
          kernels::cpu::accumulate_bf16(grad_w_acc.mutable_data_ptr<float>(),
                                        reinterpret_cast<const uint16_t*>(dw_chunk.const_data_ptr<at::BFloat16>()),
                                        grad_w_acc.numel());
        }
        break;
      case Path::kMixedAdd:
        grad_w_acc.add_(at::mm(r.grad.t(), h));
        break;
    }
  }
  if (with_grad) *grad_weight = grad_w_acc.to(weight.scalar_type());
  return {loss_sum, z_sum};
}

// expected: the gradient loss_sum is expected to receive (0-d fp32 on the inputs' device), or
// undefined. The saved gradients are those of loss_sum times expected; backward multiplies them by
// grad_output / expected (exactly 1 when the guess was right).
struct LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& labels, int64_t ignore_index, double z_loss, int64_t chunk,
                               const std::optional<at::Tensor>& expected_in) {
    // An optional, since a Function's tensor inputs must be defined.
    const at::Tensor expected = expected_in.value_or(at::Tensor());
    at::Tensor grad_hidden, grad_weight;
    auto [loss_sum, z_sum] =
        chunked_pass(hidden, weight, labels, ignore_index, z_loss, chunk, true, expected, &grad_hidden, &grad_weight);
    ctx->save_for_backward({grad_hidden, grad_weight, expected});
    ctx->mark_non_differentiable({z_sum});
    return {loss_sum, z_sum};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor g = grad_outputs[0];  // 0-d
    at::Tensor grad_hidden = saved[0], grad_weight = saved[1];
    const at::Tensor& expected = saved[2];
    if (g.defined()) {
      if (expected.defined()) g = g.to(at::kFloat) / expected;
      grad_hidden = grad_hidden * g.to(grad_hidden.scalar_type());
      grad_weight = grad_weight * g.to(grad_weight.scalar_type());
    }
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void check_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels) {
  TORCH_CHECK(hidden.dim() >= 1 && weight.dim() == 2 && hidden.size(-1) == weight.size(1),
              "linear_cross_entropy: weight ", weight.sizes(), " must be [V, H] with H the last dimension of hidden ",
              hidden.sizes());
  TORCH_CHECK(labels.sizes() == hidden.sizes().slice(0, hidden.dim() - 1), "linear_cross_entropy: labels ",
              labels.sizes(), " must match hidden ", hidden.sizes(), " without its last dimension");
  TORCH_CHECK(at::isIntegralType(labels.scalar_type(), /*includeBool=*/false),
              "linear_cross_entropy: labels must be integers, got ", labels.scalar_type());
  TORCH_CHECK(at::isFloatingType(hidden.scalar_type()) && hidden.scalar_type() == weight.scalar_type(),
              "linear_cross_entropy: hidden is ", hidden.scalar_type(), " and weight is ", weight.scalar_type(),
              "; both must be the same floating type");
  TORCH_CHECK(hidden.device() == weight.device() && labels.device() == hidden.device(),
              "linear_cross_entropy: hidden, weight and labels must be on one device");
}

LinearCrossEntropyResult finish(at::Tensor loss_sum, at::Tensor z_sum, const at::Tensor& labels,
                                const LinearCrossEntropyOptions& o) {
  LinearCrossEntropyResult r;
  r.num_tokens = labels.ne(o.ignore_index).sum();
  r.loss_sum = std::move(loss_sum);
  r.z_loss_sum = z_sum.detach();
  r.loss = o.reduction == LossReduction::kSum ? r.loss_sum : r.loss_sum / r.num_tokens;
  return r;
}

}  // namespace

void testing::force_cpu_cross_entropy_aten(bool on) {
  if (!on) return env::clear_override("KILN_CPU_CE_LOOP");
  env::set_override("KILN_CPU_CE_LOOP", "0");
}

bool cpu_cross_entropy_uses_loop(at::ScalarType logits) {
  return (logits == at::kFloat || logits == at::kBFloat16) && env::flag("KILN_CPU_CE_LOOP").value_or(true);
}

WeightGradAccumulation linear_cross_entropy_weight_grad_path(at::ScalarType matmul, bool cuda, int arch) {
  using Path = WeightGradAccumulation;
  if (matmul == at::kFloat || matmul == at::kDouble) return Path::kSameDtype;
  if (cuda) {
    // addmm's out_dtype overload takes an fp32 `self` from torch 2.10 on ("self dtype must match
    // either out_dtype or mat1 dtype"; docs/kernels.md, "Known limits"); an older LibTorch gets the
    // fp32 copies. ATen's bf16 GEMM with fp32 output checks the device: "only supported for CUDA
    // devices with compute capability 8.0 or higher" (at::cuda::blas::gemm<BFloat16, float>).
    constexpr bool kAddmmTakesFp32Self =
        TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10);
    if (!kAddmmTakesFp32Self) return Path::kUpcast;
    return matmul == at::kBFloat16 && arch < 80 ? Path::kUpcast : Path::kOutDtype;
  }
  if (matmul == at::kBFloat16) return cpu_cross_entropy_uses_loop(at::kBFloat16) ? Path::kCpuBf16Rows : Path::kMixedAdd;
  // CPU fp16: ATen has no fp32-output GEMM on the CPU; the fp32 copies spare an fp16 [V, H]
  // product rounded per chunk and the fp32 [V, H] temporary of a mixed-dtype add_.
  return Path::kUpcast;
}

void testing::force_cpu_head_fp32(int mode) {
  if (mode < 0) return env::clear_override("KILN_CPU_HEAD_FP32");
  env::set_override("KILN_CPU_HEAD_FP32", mode != 0 ? "1" : "0");
}

at::ScalarType linear_cross_entropy_matmul_dtype(at::ScalarType compute, bool cpu) {
  if (!cpu || (compute != at::kBFloat16 && compute != at::kHalf)) return compute;
  const std::optional<bool> fp32 = env::flag("KILN_CPU_HEAD_FP32");
  return (fp32 ? *fp32 : !cpu_native_low_precision_gemm(compute)) ? at::kFloat : compute;
}

namespace {
constexpr int64_t kCudaMinChunkTokens = 1024;
}  // namespace

int64_t auto_chunk_tokens(int64_t rows, int64_t vocab, int64_t hidden, bool cpu) {
  if (cpu) {
    constexpr int64_t kCpuChunkLogits = int64_t{1} << 23;
    int64_t chunk = 64;
    while (chunk * 2 * std::max<int64_t>(vocab, 1) <= kCpuChunkLogits) chunk *= 2;
    return std::max<int64_t>(1, std::min(rows, chunk));
  }
  // Liger's rule: about as many logits per chunk as hidden has elements.
  const int64_t factor = std::max<int64_t>(1, (vocab + hidden - 1) / std::max<int64_t>(hidden, 1));
  const int64_t want = (rows + factor - 1) / factor;
  int64_t chunk = 1;
  while (chunk < want) chunk *= 2;
  // At least kCudaMinChunkTokens and at least H (rounded down to a power of two) rows: each chunk
  // reads and writes the whole fp32 [V, H] weight-gradient sum and reads the [V, H] weight twice,
  // so k chunks cost k x (8 + 4 c) V H bytes; with H rows a chunk's logits are c V H bytes, the
  // size of the weight's own compute-dtype copy (docs/kernels.md, "Linear + cross-entropy").
  int64_t floor_h = 1;
  while (floor_h * 2 <= hidden) floor_h *= 2;
  chunk = std::max({chunk, kCudaMinChunkTokens, floor_h});
  return std::max<int64_t>(1, std::min(rows, chunk));
}

LinearCrossEntropyResult linear_cross_entropy_reference(const at::Tensor& hidden, const at::Tensor& weight,
                                                        const at::Tensor& labels, const LinearCrossEntropyOptions& o) {
  check_inputs(hidden, weight, labels);
  const at::Tensor logits = at::linear(hidden, weight);  // [..., V] under autocast in the autocast dtype
  const at::ScalarType acc = at::promote_types(logits.scalar_type(), at::kFloat);
  const at::Tensor x = logits.reshape({-1, weight.size(0)}).to(acc);
  const at::Tensor y = labels.reshape({-1}).to(at::kLong);
  at::Tensor loss_sum = at::cross_entropy_loss(x, y, {}, at::Reduction::Sum, o.ignore_index);
  at::Tensor z_sum = at::zeros({}, x.options());
  if (o.z_loss != 0) {
    z_sum = (at::logsumexp(x, -1).square() * y.ne(o.ignore_index).to(acc)).sum() * o.z_loss;
    loss_sum = loss_sum + z_sum;
  }
  return finish(loss_sum, z_sum, labels, o);
}

namespace {
thread_local int checked_labels_depth = 0;
}  // namespace

CheckedLabelsScope::CheckedLabelsScope() {
  ++checked_labels_depth;
}

CheckedLabelsScope::~CheckedLabelsScope() {
  --checked_labels_depth;
}

bool CheckedLabelsScope::active() {
  return checked_labels_depth > 0;
}

LinearCrossEntropyResult linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                              const at::Tensor& labels, const LinearCrossEntropyOptions& o) {
  if (backend(Op::kLinearCrossEntropy) == Backend::kAten)
    return linear_cross_entropy_reference(hidden, weight, labels, o);
  check_inputs(hidden, weight, labels);
  TORCH_CHECK(o.chunk_tokens >= 0, "linear_cross_entropy: chunk_tokens must be >= 0, got ", o.chunk_tokens);
  const int64_t vocab = weight.size(0), dim = weight.size(1);
  const at::Tensor y = labels.reshape({-1}).to(at::kLong).contiguous();
  // An out-of-range target would read outside a row in the kernel; the reference rejects it too.
  // On the CPU a loop over the labels; on a device one host read, left out where the caller
  // checked the labels already (CheckedLabelsScope).
  if (y.is_cpu()) {
    const int64_t* p = y.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      TORCH_CHECK(p[i] == o.ignore_index || (p[i] >= 0 && p[i] < vocab), "linear_cross_entropy: label ", p[i],
                  " is outside [0, ", vocab, ") and not ignore_index ", o.ignore_index);
    }
  } else if (!CheckedLabelsScope::active()) {
    TORCH_CHECK(at::logical_or(y.eq(o.ignore_index), y.ge(0).logical_and(y.lt(vocab))).all().item<bool>(),
                "linear_cross_entropy: a label is outside [0, ", vocab, ") and not ignore_index ", o.ignore_index);
  }
  // The compute dtype at::linear would use: the autocast dtype when autocast covers this device.
  at::ScalarType compute = hidden.scalar_type();
  const at::DeviceType dev = hidden.device().type();
  if (at::autocast::is_autocast_enabled(dev) && at::isFloatingType(compute) && compute != at::kDouble) {
    compute = at::autocast::get_autocast_dtype(dev);
  }
  compute = linear_cross_entropy_matmul_dtype(compute, hidden.is_cpu());
  const at::Tensor h = hidden.reshape({-1, dim}).to(compute).contiguous();  // [N, H]
  const at::Tensor w = weight.to(compute).contiguous();                     // [V, H]
  const int64_t rows = h.size(0);
  const int64_t chunk = o.chunk_tokens > 0 ? o.chunk_tokens : auto_chunk_tokens(rows, vocab, dim, h.is_cpu());
  const bool needs_grad = at::GradMode::is_enabled() && (h.requires_grad() || w.requires_grad());
  if (!needs_grad || rows == 0) {
    const at::AutoGradMode no_grad(false);
    auto [loss_sum, z_sum] =
        chunked_pass(h, w, y, o.ignore_index, o.z_loss, std::max<int64_t>(chunk, 1), false, {}, nullptr, nullptr);
    return finish(loss_sum, z_sum, labels, o);
  }
  // The scaled gradient is what gets rounded where rounding loses it: bf16/fp16 (fp16's subnormals
  // end at 6e-8; bf16's rounding of 1 / targets in backward would bias the whole gradient by up to
  // 2^-9). fp32 and fp64 keep their unscaled gradient (their bits unchanged).
  std::optional<at::Tensor> expected;
  if (o.expected_grad.defined() && (compute == at::kHalf || compute == at::kBFloat16)) {
    TORCH_CHECK(o.expected_grad.numel() == 1 && at::isFloatingType(o.expected_grad.scalar_type()),
                "linear_cross_entropy: expected_grad must be one floating-point value, got ",
                o.expected_grad.scalar_type(), " ", o.expected_grad.sizes());
    expected = o.expected_grad.detach().reshape({}).to(h.device(), at::kFloat).contiguous();
  }
  // The Function's body calls ATen ops that autocast would re-cast; its inputs are already cast.
  const AutocastOff no_autocast;
  const variable_list out = LinearCrossEntropyFunction::apply(h, w, y, o.ignore_index, o.z_loss, chunk, expected);
  return finish(out[0], out[1], labels, o);
}

}  // namespace kiln::ops
