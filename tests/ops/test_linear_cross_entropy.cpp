// ops::linear_cross_entropy (chunked, gradients computed in the forward pass) against autograd
// through the plain ATen composition at::linear + at::cross_entropy_loss (fp32, tight), against
// finite differences in fp64, and the fused model loss against the model's full-logits loss.
// [cuda]: the kiln kernel path against the fp32 reference with the low-precision rule (docs/architecture.md, design
// rule 4).
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm_ops.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <catch2/catch.hpp>

#include "kiln/model/llama.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "ops/gradcheck.h"
#include "support.h"

using kiln::ops::LinearCrossEntropyOptions;
using kiln::ops::LossReduction;
using kiln::test::max_abs_diff;

namespace {

// The independent reference: autograd on the full logits.
struct Ref {
  at::Tensor loss, grad_hidden, grad_weight;
};
Ref reference(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, double z_loss,
              LossReduction reduction, double grad_scale) {
  const at::Tensor h = hidden.detach().clone().requires_grad_(true), w = weight.detach().clone().requires_grad_(true);
  const at::Tensor logits = at::linear(h, w).reshape({-1, w.size(0)}).to(at::kFloat);
  const at::Tensor y = labels.reshape({-1});
  const at::Tensor valid = y.ne(-100);
  at::Tensor loss = at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum, -100);
  loss = loss + (at::logsumexp(logits, -1).square() * valid).sum() * z_loss;
  if (reduction == LossReduction::kMean) loss = loss / valid.sum();
  (loss * grad_scale).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

// The largest difference relative to the largest magnitude of `want`.
double rel_diff(const at::Tensor& got, const at::Tensor& want) {
  return max_abs_diff(got, want) / std::max(want.abs().max().item<double>(), 1e-30);
}

// A head whose non-target probabilities are all about 1e-8 (fp16's smallest subnormal is 6e-8,
// and a value under half of it rounds to 0): the target (class 0 or 1, chosen by hidden's first
// two dimensions) gets 1 - 1e-5 of the mass, the 998 others share 1e-5, and their weight rows
// share a direction (+1), so that their gradient neither vanishes nor cancels. The last row is
// ignored. Rows 2.. of grad(weight) and dims 2.. of grad(hidden) come (almost) only from them.
struct TinyProbHead {
  at::Tensor hidden, weight, labels;
  int64_t targets = 0;
};
TinyProbHead tiny_probability_head(at::ScalarType dtype, int64_t rows) {
  const int64_t vocab = 1000, dim = 16;
  at::Tensor w = at::zeros({vocab, dim});
  w.narrow(1, 2, dim - 2).copy_(at::randn({vocab, dim - 2}) * 0.5 + 1.0);
  w[0][0] = 18.4;  // exp(-18.4) = 1.0e-8
  w[1][1] = 18.4;
  at::Tensor labels = at::randint(2, {rows}, at::kLong);
  at::Tensor h = at::zeros({rows, dim});
  h.narrow(1, 2, dim - 2).copy_(at::randn({rows, dim - 2}) * 0.1);
  h.index_put_({at::arange(rows), labels}, 1.0);
  labels[rows - 1] = -100;
  return {h.to(dtype), w.to(dtype), labels, rows - 1};
}

// The trainer's backward (train/gradient_accumulation.cpp): loss_sum / targets, times the loss scale; the
// gradients of hidden and weight. The head runs unfused (linear_ce=aten, autograd through the full
// logits: the reference) or fused, told to expect `expected` (undefined: told nothing).
struct HeadGrads {
  at::Tensor loss_sum, grad_hidden, grad_weight;
};
HeadGrads trainer_backward(const TinyProbHead& head, double loss_scale, bool aten, const at::Tensor& expected,
                           int64_t chunk) {
  const at::Tensor h = head.hidden.clone().requires_grad_(true), w = head.weight.clone().requires_grad_(true);
  if (aten) kiln::ops::set_backends("kiln,linear_ce=aten");
  const auto r = kiln::ops::linear_cross_entropy(
      h, w, head.labels, {.chunk_tokens = chunk, .reduction = LossReduction::kSum, .expected_grad = expected});
  kiln::ops::set_backend(kiln::ops::Backend::kKiln);
  const at::Tensor scale = at::full({1}, loss_scale, at::TensorOptions().dtype(at::kFloat).device(h.device()));
  (r.loss_sum.to(at::kFloat) * (1.0 / static_cast<double>(head.targets)) * scale.squeeze()).backward();
  return {r.loss_sum.detach(), h.grad(), w.grad()};
}

// What the trainer passes as expected_grad for that backward.
at::Tensor trainer_expected_grad(double loss_scale, int64_t targets, const at::Device& device) {
  return at::full({1}, loss_scale, at::TensorOptions().dtype(at::kFloat).device(device)).squeeze() *
         (1.0 / static_cast<double>(targets));
}

at::Tensor random_labels(std::vector<int64_t> shape, int64_t vocab) {
  at::Tensor y = at::randint(vocab, shape, at::kLong);
  y.view({-1}).index_put_({at::rand({y.numel()}).lt(0.3)}, -100);  // about 30% ignored
  y.view({-1})[0] = 3;                                             // at least one target
  return y;
}

}  // namespace

TEST_CASE("chunked linear cross-entropy matches autograd on the full logits (fp32)", "[ops][linear_ce]") {
  at::manual_seed(1);
  struct Case {
    std::vector<int64_t> rows;
    int64_t dim, vocab, chunk;
    double z;
    LossReduction reduction;
  };
  const std::vector<Case> cases = {
      {{7}, 1000, 37, 3, 0.0, LossReduction::kMean},    // odd sizes, a partial last chunk
      {{2, 5}, 16, 129, 4, 1e-3, LossReduction::kSum},  // z-loss, [B, T] rows
      {{7}, 8, 50, 0, 0.0, LossReduction::kMean},       // automatic chunk
      {{9}, 24, 64, 100, 1e-2, LossReduction::kMean},   // one chunk larger than the rows
  };
  // Both CPU paths of a chunk: the fused fp32 row loop (the default) and ATen's ops.
  const bool aten_chunks = GENERATE(false, true);
  kiln::ops::testing::force_cpu_cross_entropy_aten(aten_chunks);
  CAPTURE(aten_chunks);
  for (const Case& c : cases) {
    std::vector<int64_t> hshape = c.rows;
    hshape.push_back(c.dim);
    const at::Tensor hidden = at::randn(hshape), weight = at::randn({c.vocab, c.dim}) * 0.2;
    const at::Tensor labels = random_labels(c.rows, c.vocab);
    const Ref want = reference(hidden, weight, labels, c.z, c.reduction, 2.5);
    const at::Tensor h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
    const auto got = kiln::ops::linear_cross_entropy(
        h, w, labels, {.z_loss = c.z, .chunk_tokens = c.chunk, .reduction = c.reduction});
    (got.loss * 2.5).backward();
    CAPTURE(c.dim, c.vocab, c.chunk, c.z);
    CHECK(got.num_tokens.item<int64_t>() == labels.ne(-100).sum().item<int64_t>());
    CHECK(max_abs_diff(got.loss, want.loss) < 1e-4 * std::max(1.0, want.loss.abs().item<double>()));
    CHECK(max_abs_diff(h.grad(), want.grad_hidden) < 1e-5);
    CHECK(max_abs_diff(w.grad(), want.grad_weight) < 1e-5);
    if (c.z == 0) CHECK(got.z_loss_sum.item<double>() == 0);
    // Without gradients the same chunks give the same loss.
    const at::NoGradGuard no_grad;
    const auto eval = kiln::ops::linear_cross_entropy(
        hidden, weight, labels, {.z_loss = c.z, .chunk_tokens = c.chunk, .reduction = c.reduction});
    CHECK(max_abs_diff(eval.loss, got.loss) < 1e-6 * std::max(1.0, want.loss.abs().item<double>()));
  }
  kiln::ops::testing::force_cpu_cross_entropy_aten(false);
}

TEST_CASE("chunked linear cross-entropy passes an fp64 finite-difference check", "[ops][linear_ce]") {
  at::manual_seed(2);
  const at::Tensor hidden = at::randn({5, 3}), weight = at::randn({11, 3});
  const at::Tensor labels = at::tensor({4, -100, 0, 10, 7}, at::kLong);
  for (double z : {0.0, 0.1}) {
    const double err = kiln::test::gradcheck_max_error(
        [&](const std::vector<at::Tensor>& in) {
          return kiln::ops::linear_cross_entropy(in[0], in[1], labels, {.z_loss = z, .chunk_tokens = 2}).loss * 1.7;
        },
        {hidden, weight});
    CAPTURE(z);
    CHECK(err < 1e-7);
  }
}

TEST_CASE("under CPU bf16 autocast the head runs in fp32 or bf16 as chosen, both against the reference",
          "[ops][linear_ce]") {
  // Both paths on every machine (the automatic choice depends on the CPU's AMX): fp32 must be the
  // fp32 reference to fp32 rounding; bf16 within bf16's, and visibly not fp32.
  at::manual_seed(5);
  const at::Tensor hidden = at::randn({2, 24, 32}), weight = at::randn({300, 32}) * 0.1;
  const at::Tensor labels = random_labels({2, 24}, 300);
  const Ref want = reference(hidden, weight, labels, 1e-3, LossReduction::kMean, 1.0);
  // Both chunk paths for each: the fused CPU rows (fp32 or bf16 logits) and ATen's ops.
  const bool aten_chunks = GENERATE(false, true);
  kiln::ops::testing::force_cpu_cross_entropy_aten(aten_chunks);
  double loss_fp32 = 0;
  for (int fp32 : {1, 0}) {
    kiln::ops::testing::force_cpu_head_fp32(fp32);
    CHECK(kiln::ops::linear_cross_entropy_matmul_dtype(at::kBFloat16, true) == (fp32 ? at::kFloat : at::kBFloat16));
    CHECK(kiln::ops::linear_cross_entropy_matmul_dtype(at::kBFloat16, false) == at::kBFloat16);  // CUDA keeps it
    const at::Tensor h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
    at::Tensor loss;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      loss = kiln::ops::linear_cross_entropy(h, w, labels, {.z_loss = 1e-3, .chunk_tokens = 16}).loss;
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
    loss.backward();
    CAPTURE(fp32);
    CHECK(w.grad().scalar_type() == at::kFloat);
    const double tol = fp32 ? 1e-5 : 2e-2;
    CHECK(max_abs_diff(loss, want.loss) < tol * want.loss.abs().item<double>());
    CHECK(max_abs_diff(h.grad(), want.grad_hidden) < tol * want.grad_hidden.abs().max().item<double>());
    CHECK(max_abs_diff(w.grad(), want.grad_weight) < tol * want.grad_weight.abs().max().item<double>());
    if (fp32) {
      loss_fp32 = loss.item<double>();
    } else {
      CHECK(std::abs(loss.item<double>() - loss_fp32) > 1e-6);  // the bf16 path did run in bf16
    }
    CAPTURE(aten_chunks);
  }
  kiln::ops::testing::force_cpu_head_fp32(-1);
  kiln::ops::testing::force_cpu_cross_entropy_aten(false);
}

TEST_CASE("the bf16 CPU head: the fused rows give ATen's chunk path to bf16 rounding", "[ops][linear_ce]") {
  // The same bf16 head (forced) with the fused rows and with ATen's log_softmax path: the loss to
  // fp32 rounding (both reduce in fp32), the gradients to bf16's (each rounds once, ~2^-8).
  at::manual_seed(6);
  kiln::ops::testing::force_cpu_head_fp32(0);
  const at::Tensor hidden = at::randn({3, 40, 48}), weight = at::randn({1000, 48}) * 0.1;
  const at::Tensor labels = random_labels({3, 40}, 1000);
  at::Tensor loss[2], gh[2], gw[2];
  for (int aten : {0, 1}) {
    kiln::ops::testing::force_cpu_cross_entropy_aten(aten == 1);
    const at::Tensor h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    loss[aten] = kiln::ops::linear_cross_entropy(h, w, labels, {.z_loss = 1e-3, .chunk_tokens = 32}).loss;
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    loss[aten].backward();
    gh[aten] = h.grad();
    gw[aten] = w.grad();
    CHECK(gw[aten].scalar_type() == at::kFloat);
  }
  kiln::ops::testing::force_cpu_cross_entropy_aten(false);
  kiln::ops::testing::force_cpu_head_fp32(-1);
  CHECK(max_abs_diff(loss[0], loss[1]) < 1e-5 * loss[1].abs().item<double>());
  CHECK(max_abs_diff(gh[0], gh[1]) < gh[1].abs().max().item<double>() / 64);
  CHECK(max_abs_diff(gw[0], gw[1]) < gw[1].abs().max().item<double>() / 64);
}

TEST_CASE("an fp16 head rounds the loss-scaled gradient, as the aten reference does", "[ops][linear_ce]") {
  // GradScaler's first scale, 65536, over the step's targets: the reference rounds (softmax -
  // onehot) * 65536 / N to fp16, where probabilities of 1e-8 are representable; rounding the
  // unscaled gradient first (the fused head told nothing) flushes them to 0 and loses their part
  // of grad(hidden) and all of grad(weight)'s rows 2.. . The head runs natively in fp16 on the CPU
  // (ATen's chunk ops; the fp32 copies for the weight gradient).
  at::manual_seed(11);
  kiln::ops::testing::force_cpu_head_fp32(0);
  const TinyProbHead head = tiny_probability_head(at::kHalf, 12);
  const double scale = 65536.0;
  const at::Tensor expected = trainer_expected_grad(scale, head.targets, at::kCPU);
  const HeadGrads ref = trainer_backward(head, scale, /*aten=*/true, {}, 5);
  const HeadGrads told = trainer_backward(head, scale, false, expected, 5);
  const HeadGrads untold = trainer_backward(head, scale, false, {}, 5);
  // A guess that is off (the scaler backed off by 3 after the forward, say) stays correct.
  const HeadGrads ref3 = trainer_backward(head, scale / 3, true, {}, 5);
  const HeadGrads off = trainer_backward(head, scale / 3, false, expected, 5);
  kiln::ops::testing::force_cpu_head_fp32(-1);

  REQUIRE(told.grad_hidden.scalar_type() == at::kHalf);
  // The case is the one described: most non-target entries of the unscaled gradient are 0 in fp16.
  const at::Tensor logits = at::linear(head.hidden.to(at::kFloat), head.weight.to(at::kFloat));
  const at::Tensor p = at::softmax(logits, -1).narrow(1, 2, 998);
  CHECK(p.lt(2.98e-8).to(at::kFloat).mean().item<double>() > 0.9);
  auto blocks = [](const HeadGrads& g) {  // {all of grad(hidden), its dims 2.., grad(weight) rows 2..}
    return std::vector<at::Tensor>{g.grad_hidden.to(at::kFloat), g.grad_hidden.narrow(1, 2, 14).to(at::kFloat),
                                   g.grad_weight.narrow(0, 2, 998).to(at::kFloat)};
  };
  const auto want = blocks(ref), got = blocks(told), got_untold = blocks(untold), want3 = blocks(ref3),
             got_off = blocks(off);
  CHECK(max_abs_diff(told.loss_sum, ref.loss_sum) < 1e-3);
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = rel_diff(got[i], want[i]), err_untold = rel_diff(got_untold[i], want[i]);
    const double err_off = rel_diff(got_off[i], want3[i]);
    CAPTURE(i, err, err_untold, err_off);
    CHECK(err < 1e-2);
    CHECK(err_off < 2e-2);
    if (i > 0) CHECK(err_untold > 0.3);  // what the fused head did before it was told the scale
  }
}

TEST_CASE("expected_grad: bf16 heads round the scaled gradient too, fp32 ones ignore it bitwise", "[ops][linear_ce]") {
  at::manual_seed(12);
  SECTION("bf16, the fused CPU rows and ATen's chunk ops, against autograd in fp32") {
    // bf16 trains without a loss scale: the gradient is 1 / targets.
    const at::Tensor hidden = at::randn({2, 24, 32}).to(at::kBFloat16);
    const at::Tensor weight = (at::randn({300, 32}) * 0.1).to(at::kBFloat16);
    const at::Tensor labels = random_labels({2, 24}, 300);
    const int64_t targets = labels.ne(-100).sum().item<int64_t>();
    const double inv = 1.0 / static_cast<double>(targets);
    const Ref want = reference(hidden.to(at::kFloat), weight.to(at::kFloat), labels, 0.0, LossReduction::kSum, inv);
    kiln::ops::testing::force_cpu_head_fp32(0);
    for (bool aten_chunks : {false, true}) {
      kiln::ops::testing::force_cpu_cross_entropy_aten(aten_chunks);
      const at::Tensor h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
      const auto r = kiln::ops::linear_cross_entropy(h, w, labels,
                                                     {.chunk_tokens = 16,
                                                      .reduction = LossReduction::kSum,
                                                      .expected_grad = trainer_expected_grad(1.0, targets, at::kCPU)});
      (r.loss_sum * inv).backward();
      CAPTURE(aten_chunks);
      CHECK(rel_diff(h.grad().to(at::kFloat), want.grad_hidden) < 2e-2);
      CHECK(rel_diff(w.grad().to(at::kFloat), want.grad_weight) < 2e-2);
    }
    kiln::ops::testing::force_cpu_cross_entropy_aten(false);
    kiln::ops::testing::force_cpu_head_fp32(-1);
  }
  SECTION("fp32: the same bits with and without it") {
    const TinyProbHead head = tiny_probability_head(at::kFloat, 12);
    const at::Tensor expected = trainer_expected_grad(65536.0, head.targets, at::kCPU);
    const HeadGrads told = trainer_backward(head, 65536.0, false, expected, 5);
    const HeadGrads untold = trainer_backward(head, 65536.0, false, {}, 5);
    CHECK(at::equal(told.grad_hidden, untold.grad_hidden));
    CHECK(at::equal(told.grad_weight, untold.grad_weight));
  }
}

TEST_CASE("the fused head's weight-gradient accumulation, per dtype and device", "[ops][linear_ce]") {
  using kiln::ops::linear_cross_entropy_weight_grad_path;
  using kiln::ops::WeightGradAccumulation;
  CHECK(linear_cross_entropy_weight_grad_path(at::kFloat, true, 70) == WeightGradAccumulation::kSameDtype);
  CHECK(linear_cross_entropy_weight_grad_path(at::kDouble, false, 0) == WeightGradAccumulation::kSameDtype);
  CHECK(linear_cross_entropy_weight_grad_path(at::kHalf, false, 0) == WeightGradAccumulation::kUpcast);
  // CUDA: the fp32-output addmm where this LibTorch takes an fp32 `self` (2.10 on), except bf16
  // below sm_80, which ATen refuses; fp16 on a V100 is fine.
  const bool fp32_self = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10);
  const auto out_dtype = fp32_self ? WeightGradAccumulation::kOutDtype : WeightGradAccumulation::kUpcast;
  CHECK(linear_cross_entropy_weight_grad_path(at::kHalf, true, 70) == out_dtype);
  CHECK(linear_cross_entropy_weight_grad_path(at::kBFloat16, true, 80) == out_dtype);
  CHECK(linear_cross_entropy_weight_grad_path(at::kBFloat16, true, 90) == out_dtype);
  CHECK(linear_cross_entropy_weight_grad_path(at::kBFloat16, true, 70) == WeightGradAccumulation::kUpcast);
  CHECK(linear_cross_entropy_weight_grad_path(at::kBFloat16, true, 75) == WeightGradAccumulation::kUpcast);
}

#ifdef KILN_WITH_CUDA
TEST_CASE("the LibTorch under test takes the CUDA head's fp32-output addmm with the fp32 sum as self",
          "[ops][linear_ce]") {
  // The CUDA kernel of aten::addmm.dtype_out, called through the dispatcher with CPU tensors: its
  // argument checks run before its device check, so a form they refuse fails with a dtype error
  // and the one linear_cross_entropy calls (out = self = the fp32 sum, bf16/fp16 operands) gets
  // as far as the device check, on this LibTorch (2.11 here, 2.10 under check_torch_builds.sh 12).
  const auto op = c10::Dispatcher::singleton().findSchema({"aten::addmm", "dtype_out"});
  REQUIRE(op.has_value());
  REQUIRE(op->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  if (kiln::ops::linear_cross_entropy_weight_grad_path(at::kHalf, true, 90) !=
      kiln::ops::WeightGradAccumulation::kOutDtype) {
    return;  // an older LibTorch: the head does not call it
  }
  const c10::DispatchKeySet cuda(c10::DispatchKey::CUDA);
  auto call = [&](at::Tensor& out, const at::Tensor& self, at::ScalarType operands) -> std::string {
    const at::Tensor g_t = at::zeros({6, 4}, operands), h = at::zeros({4, 5}, operands);
    try {
      at::_ops::addmm_dtype_out::redispatch(cuda, self, g_t, h, at::kFloat, 1, 1, out);
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();  // the check's message alone (a backtrace names functions)
    }
    return "no error";
  };
  for (auto operands : {at::kHalf, at::kBFloat16}) {
    CAPTURE(operands);
    at::Tensor sum = at::zeros({6, 5}, at::kFloat);
    const std::string ours = call(sum, sum, operands);
    CHECK_THAT(ours, Catch::Matchers::Contains("GPU") || Catch::Matchers::Contains("cuda"));
    CHECK_THAT(ours, !Catch::Matchers::Contains("dtype"));
    // The control: a self of a third dtype is refused by the dtype checks this probe reaches.
    at::Tensor out = at::zeros({6, 5}, at::kFloat);
    CHECK_THAT(call(out, at::zeros({6, 5}, at::kDouble), operands), Catch::Matchers::Contains("dtype"));
  }
}
#endif

TEST_CASE("the automatic chunk: at least 1024 rows and H on CUDA, the CPU rule unchanged", "[ops][linear_ce]") {
  using kiln::ops::auto_chunk_tokens;
  // CUDA, Llama-3.2-1B's head (V 128256, H 2048): H rows where Liger's rule gave 256
  // (next_pow2(ceil(8192 / ceil(128256 / 2048))) = next_pow2(131)): 4 chunks, not 32.
  CHECK(auto_chunk_tokens(8192, 128256, 2048) == 2048);
  CHECK(auto_chunk_tokens(8193, 128256, 2048) == 2048);  // a partial fifth chunk
  CHECK(auto_chunk_tokens(8192, 128256, 3000) == 2048);  // H rounded down to a power of two
  CHECK(auto_chunk_tokens(8192, 128256, 4096) == 4096);  // an 8B head: H rows
  CHECK(auto_chunk_tokens(8192, 32000, 512) == 1024);    // the 1024-row floor above H
  CHECK(auto_chunk_tokens(1000, 128256, 2048) == 1000);  // at most the rows
  CHECK(auto_chunk_tokens(1, 128256, 2048) == 1);
  // Liger's rule where it asks for more: next_pow2(ceil(2^20 / 63)) = 32768 rows.
  CHECK(auto_chunk_tokens(int64_t{1} << 20, 128256, 2048) == 32768);
  // The CPU: the largest power of two with chunk x V <= 2^23 logits, at least 64, at most rows.
  CHECK(auto_chunk_tokens(8192, 32000, 512, /*cpu=*/true) == 256);
  CHECK(auto_chunk_tokens(8192, 128256, 2048, /*cpu=*/true) == 64);
  CHECK(auto_chunk_tokens(100, 32000, 512, /*cpu=*/true) == 100);
}

TEST_CASE("the fp32 copies' weight gradient is the fp32 sum over chunks, rounded once", "[ops][linear_ce]") {
  // The path of CUDA bf16 below sm_80 and of the CPU fp16 head (this one). With a zero weight
  // every probability is 1/8 and each entry of the chunk's gradient is 1/8 or -7/8 exactly, so the
  // fp32 sum of 64 one-row chunks of fp16 hidden in [0.5, 2) is exact and grad(weight) must be
  // that sum rounded once to fp16, bit for bit. Rounding each chunk's product to fp16 first (what
  // an fp16 GEMM per chunk would do) gives other bits.
  at::manual_seed(13);
  kiln::ops::testing::force_cpu_head_fp32(0);
  const int64_t rows = 64, vocab = 8, dim = 24;
  const at::Tensor hidden = (at::rand({rows, dim}) * 1.5 + 0.5).to(at::kHalf);
  const at::Tensor labels = at::arange(rows, at::kLong).remainder(vocab).index_select(0, at::randperm(rows));
  const at::Tensor h = hidden.clone().requires_grad_(true), w = at::zeros({vocab, dim}, at::kHalf).requires_grad_(true);
  kiln::ops::linear_cross_entropy(h, w, labels, {.chunk_tokens = 1, .reduction = LossReduction::kSum})
      .loss_sum.backward();
  kiln::ops::testing::force_cpu_head_fp32(-1);
  const at::Tensor g = at::full({rows, vocab}, 0.125, at::kDouble) - at::one_hot(labels, vocab).to(at::kDouble);
  const at::Tensor exact = g.t().mm(hidden.to(at::kDouble));
  CHECK(at::equal(w.grad(), exact.to(at::kHalf)));
  at::Tensor per_chunk = at::zeros({vocab, dim}, at::kFloat);
  for (int64_t i = 0; i < rows; ++i) {
    per_chunk += g.narrow(0, i, 1).t().mm(hidden.to(at::kDouble).narrow(0, i, 1)).to(at::kHalf).to(at::kFloat);
  }
  CHECK_FALSE(at::equal(per_chunk.to(at::kHalf), exact.to(at::kHalf)));
}

TEST_CASE("the aten backend of linear cross-entropy is the full-logits reference", "[ops][linear_ce]") {
  at::manual_seed(3);
  const at::Tensor hidden = at::randn({6, 10}), weight = at::randn({20, 10});
  const at::Tensor labels = random_labels({6}, 20);
  const auto chunked = kiln::ops::linear_cross_entropy(hidden, weight, labels, {.chunk_tokens = 4});
  kiln::ops::set_backends("kiln,linear_ce=aten");
  const auto aten = kiln::ops::linear_cross_entropy(hidden, weight, labels, {.chunk_tokens = 4});
  kiln::ops::set_backend(kiln::ops::Backend::kKiln);
  CHECK(max_abs_diff(aten.loss, reference(hidden, weight, labels, 0, LossReduction::kMean, 1).loss) < 1e-6);
  CHECK(max_abs_diff(aten.loss, chunked.loss) < 1e-5);
}

TEST_CASE("linear cross-entropy rejects bad labels and shapes", "[ops][linear_ce]") {
  const at::Tensor hidden = at::randn({3, 4}), weight = at::randn({5, 4});
  CHECK_THAT(kiln::test::error_of([&] {
               kiln::ops::linear_cross_entropy(hidden, weight, at::tensor({0, 5, 1}, at::kLong));
             }),
             Catch::Matchers::Contains("outside [0, 5)"));
  CHECK_THAT(kiln::test::error_of([&] {
               kiln::ops::linear_cross_entropy(hidden, weight, at::tensor({0, -2, 1}, at::kLong));
             }),
             Catch::Matchers::Contains("label -2 is outside [0, 5)"));
  {
    // CheckedLabelsScope leaves out only the device check (a host read); CPU labels are still checked.
    const kiln::ops::CheckedLabelsScope checked;
    CHECK(kiln::ops::CheckedLabelsScope::active());
    CHECK_THAT(kiln::test::error_of([&] {
                 kiln::ops::linear_cross_entropy(hidden, weight, at::tensor({0, 5, 1}, at::kLong));
               }),
               Catch::Matchers::Contains("label 5 is outside [0, 5)"));
  }
  CHECK_FALSE(kiln::ops::CheckedLabelsScope::active());
  CHECK_THAT(kiln::test::error_of([&] {
               kiln::ops::linear_cross_entropy(hidden, at::randn({5, 3}), at::tensor({0, 1, 1}, at::kLong));
             }),
             Catch::Matchers::Contains("must be [V, H]"));
  CHECK_THAT(kiln::test::error_of([&] {
               kiln::ops::linear_cross_entropy(hidden, weight, at::tensor({0, 1}, at::kLong));
             }),
             Catch::Matchers::Contains("labels"));
}

TEST_CASE("the model's fused loss equals its full-logits loss, gradients included", "[ops][linear_ce][model]") {
  at::manual_seed(4);
  kiln::model::LlamaConfig config = kiln::model::load_llama_config("tiny");
  for (bool tie : {false, true}) {
    config.tie_word_embeddings = tie;
    kiln::model::LlamaForCausalLM m(config);
    const at::Tensor ids = at::randint(config.vocab_size, {2, 9}, at::kLong);
    at::Tensor labels = ids.clone();
    labels[1][4] = -100;
    const auto full = m->forward(ids, labels);
    full.loss.backward();
    std::vector<at::Tensor> want;
    for (const auto& p : m->parameters()) want.push_back(p.grad().clone());
    m->zero_grad();
    m->fused_lm_loss = true;
    const auto fused = m->forward(ids, labels);
    CHECK_FALSE(fused.logits.defined());
    CHECK(fused.num_tokens.item<int64_t>() == full.num_tokens.item<int64_t>());
    CHECK(max_abs_diff(fused.loss_sum, full.loss_sum) < 1e-4);
    CHECK(max_abs_diff(fused.loss, full.loss) < 1e-5);
    fused.loss.backward();
    size_t i = 0;
    for (const auto& p : m->parameters()) CHECK(max_abs_diff(p.grad(), want[i++]) < 1e-5);
  }
}

TEST_CASE("linear cross-entropy CUDA kernel matches the fp32 reference", "[ops][linear_ce][cuda]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::manual_seed(5);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t vocab : {1000, 4099, 32000}) {
      const at::Tensor hidden32 = at::randn({67, 256}), weight32 = at::randn({vocab, 256}) * 0.05;
      const at::Tensor labels = random_labels({67}, vocab).cuda();
      const Ref ref = reference(hidden32.cuda(), weight32.cuda(), labels, 1e-4, LossReduction::kMean, 1.0);
      auto run = [&](kiln::ops::Backend b) {
        kiln::ops::set_backend(b);
        const at::Tensor h = hidden32.to(dtype).cuda().requires_grad_(true);
        const at::Tensor w = weight32.to(dtype).cuda().requires_grad_(true);
        const auto r = b == kiln::ops::Backend::kAten
                           ? kiln::ops::linear_cross_entropy_reference(h, w, labels, {.z_loss = 1e-4})
                           : kiln::ops::linear_cross_entropy(h, w, labels, {.z_loss = 1e-4, .chunk_tokens = 16});
        r.loss.backward();
        kiln::ops::set_backend(kiln::ops::Backend::kKiln);
        return Ref{r.loss.detach(), h.grad(), w.grad()};
      };
      const Ref aten = run(kiln::ops::Backend::kAten), kiln_ = run(kiln::ops::Backend::kKiln);
      CAPTURE(dtype, vocab);
      if (dtype == at::kFloat) {
        CHECK(max_abs_diff(kiln_.loss, ref.loss) < 1e-4);
        CHECK(max_abs_diff(kiln_.grad_hidden, ref.grad_hidden) < 1e-5);
        CHECK(max_abs_diff(kiln_.grad_weight, ref.grad_weight) < 1e-5);
      } else {
        CHECK(max_abs_diff(kiln_.loss, ref.loss) <= 2 * max_abs_diff(aten.loss, ref.loss) + 1e-4);
        CHECK(max_abs_diff(kiln_.grad_hidden, ref.grad_hidden) <=
              2 * max_abs_diff(aten.grad_hidden, ref.grad_hidden) + 1e-5);
        CHECK(max_abs_diff(kiln_.grad_weight, ref.grad_weight) <=
              2 * max_abs_diff(aten.grad_weight, ref.grad_weight) + 1e-5);
      }
    }
  }
}

TEST_CASE("CUDA fp16 head rounds the loss-scaled gradient as the aten reference does", "[ops][linear_ce][cuda]") {
  // The kernel reads the expected gradient on the device (no host wait) and scales before it
  // rounds; the weight gradient goes through the fp32-output addmm (the fp32 copies for bf16 below
  // sm_80, as KILN_KERNEL_ARCH=70 makes any GPU take). grad(weight)'s non-target rows depend on
  // the small probabilities alone: against the reference. grad(hidden) also holds the target's
  // 1 - p = 1e-5, which ATen's fp32 cross-entropy gets 10-20% wrong here (it subtracts a rounded
  // lse of 18.4): against fp64 from the same fp16 logits instead.
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::manual_seed(14);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    const TinyProbHead cpu = tiny_probability_head(dtype, 12);
    const TinyProbHead head{cpu.hidden.cuda(), cpu.weight.cuda(), cpu.labels.cuda(), cpu.targets};
    const double scale = dtype == at::kHalf ? 65536.0 : 1.0;
    const at::Tensor expected = trainer_expected_grad(scale, head.targets, head.hidden.device());
    const HeadGrads ref = trainer_backward(head, scale, true, {}, 5);
    const HeadGrads told = trainer_backward(head, scale, false, expected, 5);
    const HeadGrads untold = trainer_backward(head, scale, false, {}, 5);
    const at::Tensor logits = at::linear(head.hidden, head.weight).to(at::kDouble);
    const at::Tensor valid = head.labels.ne(-100).unsqueeze(1);
    const at::Tensor g64 =
        at::where(valid, at::softmax(logits, 1) - at::one_hot(head.labels.clamp_min(0), 1000), at::zeros_like(logits)) *
        (scale / static_cast<double>(head.targets));
    const at::Tensor gh64 = g64.mm(head.weight.to(at::kDouble));
    const at::Tensor want_gw = ref.grad_weight.narrow(0, 2, 998).to(at::kFloat);
    const double err_h = rel_diff(told.grad_hidden.to(at::kDouble), gh64);
    const double err_w = rel_diff(told.grad_weight.narrow(0, 2, 998).to(at::kFloat), want_gw);
    const double err_w_untold = rel_diff(untold.grad_weight.narrow(0, 2, 998).to(at::kFloat), want_gw);
    CAPTURE(dtype, err_h, err_w, err_w_untold);
    CHECK(err_h < 5e-2);
    CHECK(err_w < (dtype == at::kHalf ? 1e-2 : 2e-2));
    if (dtype == at::kHalf) CHECK(err_w_untold > 0.3);
  }
}
