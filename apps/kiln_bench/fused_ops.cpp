// kiln-bench's fused ops (rmsnorm, swiglu, rope, linear_ce, linear), each against its ATen
// reference (the eager composition, differentiated by autograd) side by side in one run:
// forward + backward time, achieved bandwidth against the measured device-to-device copy, and
// peak extra memory (timing.h).
//
// Bandwidth counts the bytes an ideal fused fwd+bwd must move (inputs read, outputs written
// once); the ATen path moves more, which is the point.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "kiln/common/dtype_names.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/ops/rmsnorm.h"
#include "kiln/ops/rope.h"
#include "kiln/ops/swiglu.h"

namespace kiln::bench {
namespace {

struct Row {
  std::string op, impl;
  double ms = 0, gbps = 0, copy_frac = 0;
  int64_t peak = 0;
  bool has_bw = true;
};

}  // namespace

void run_fused_ops(const FusedOpsCase& c, const at::TensorOptions& opt, double copy_gbps, Memory& mem,
                   nlohmann::json& out) {
  const at::Device device = opt.device();
  const at::ScalarType dtype = c10::typeMetaToScalarType(opt.dtype());
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
  const std::string& ops = c.ops;
  const int64_t tokens = c.tokens, hidden = c.hidden, inter = c.intermediate, vocab = c.vocab;
  const int64_t ce_hidden = c.ce_hidden;
  const int iters = c.iters;

  std::vector<Row> rows;
  // Runs fwd+bwd of `body` under both backends. bytes = ideal traffic (0 = compute bound).
  auto bench = [&](const std::string& op, double bytes, const std::function<void()>& body) {
    for (auto b : {kiln::ops::Backend::kKiln, kiln::ops::Backend::kAten}) {
      kiln::ops::set_backend(b);
      Row r{op, b == kiln::ops::Backend::kKiln ? "kiln" : "aten (eager)"};
      r.ms = time_it(device, iters, body) * 1e3;
      sync(device);
      mem.reset();
      body();
      sync(device);
      r.peak = mem.peak_extra();
      r.has_bw = bytes > 0;
      r.gbps = bytes / (r.ms * 1e-3) / 1e9;
      r.copy_frac = r.gbps / copy_gbps;
      rows.push_back(r);
    }
    kiln::ops::set_backend(kiln::ops::Backend::kKiln);
  };

  if (ops.find(",rmsnorm,") != std::string::npos) {
    const at::Tensor x = at::randn({tokens, hidden}, opt).requires_grad_(true);
    const at::Tensor w = (at::rand({hidden}, opt) + 0.5).requires_grad_(true);
    const at::Tensor gy = at::randn({tokens, hidden}, opt);
    // fwd: read x, write y; bwd: read x, dy, write dx (weight and its gradient are negligible)
    bench("rmsnorm fwd+bwd", 5.0 * tokens * hidden * esize, [&] {
      const at::Tensor y = kiln::ops::rmsnorm(x, w, 1e-5);
      torch::autograd::grad({y}, {x, w}, {gy});
    });
  }
  if (ops.find(",swiglu,") != std::string::npos) {
    const at::Tensor g = at::randn({tokens, inter}, opt).requires_grad_(true);
    const at::Tensor u = at::randn({tokens, inter}, opt).requires_grad_(true);
    const at::Tensor gy = at::randn({tokens, inter}, opt);
    // fwd: read g, u, write y; bwd: read g, u, dy, write dg, du
    bench("swiglu fwd+bwd", 8.0 * tokens * inter * esize, [&] {
      const at::Tensor y = kiln::ops::swiglu(g, u);
      torch::autograd::grad({y}, {g, u}, {gy});
    });
  }
  if (ops.find(",rope,") != std::string::npos) {
    // q and k of one attention layer as the model rotates them: [1, T, H * D] projection outputs
    // viewed as [1, H, T, D], GQA with a quarter of q's heads for k (Llama 3's 32 / 8).
    const int64_t head_dim = 128, heads = std::max<int64_t>(1, hidden / head_dim),
                  kv_heads = std::max<int64_t>(1, heads / 4);
    const double qk = static_cast<double>(tokens) * (heads + kv_heads) * head_dim, table = 2.0 * tokens * head_dim;
    const at::Tensor ang =
        at::arange(tokens, opt.dtype(at::kFloat)).unsqueeze(1) * at::rand({head_dim}, opt.dtype(at::kFloat));
    const at::Tensor cos = ang.cos().to(dtype).unsqueeze(0), sin = ang.sin().to(dtype).unsqueeze(0);
    auto view = [&](const at::Tensor& t, int64_t n) { return t.view({1, tokens, n, head_dim}).transpose(1, 2); };
    {
      // The kernel alone: q and k rotated in place, no autograd (the backward is the same kernel
      // with the sign flipped, dy into a fresh dx: the same bytes). Ideal bytes: q and k read and
      // written once, both tables read once. The rotation is norm-preserving, so repeating it
      // keeps the values in range.
      const at::Tensor q = at::randn({1, tokens, heads * head_dim}, opt),
                       k = at::randn({1, tokens, kv_heads * head_dim}, opt);
      bench("rope q+k fwd, in place", (2.0 * qk + table) * esize, [&] {
        const at::NoGradGuard no_grad;
        kiln::ops::apply_rope_qk_(view(q, heads), view(k, kv_heads), cos, sin);
      });
    }
    {
      // Forward and backward through autograd as the model runs them, including the `* 1` that
      // makes the fresh non-leaf projections an in-place op needs (and its backward): bytes of
      // that whole body, 8 passes over q and k (copy, rotate, rotate^T, copy's gradient) plus the
      // tables twice, so its GB/s is comparable with the kernel row's.
      const at::Tensor q = at::randn({1, tokens, heads * head_dim}, opt).requires_grad_(true),
                       k = at::randn({1, tokens, kv_heads * head_dim}, opt).requires_grad_(true);
      const at::Tensor gq = at::randn({1, heads, tokens, head_dim}, opt),
                       gk = at::randn({1, kv_heads, tokens, head_dim}, opt);
      bench("rope q+k fwd+bwd (autograd, with the view's copy)", (8.0 * qk + 2.0 * table) * esize, [&] {
        const auto [yq, yk] = kiln::ops::apply_rope_qk_(view(q * 1, heads), view(k * 1, kv_heads), cos, sin);
        torch::autograd::grad({yq, yk}, {q, k}, {gq, gk});
      });
    }
    if (dtype != at::kFloat) {
      // Autocast's case: bf16/fp16 q and k with fp32 tables and fp32 results, out of place (the
      // mixed kernel, once per tensor, or ATen's six ops). Ideal bytes: read x, write the fp32 y,
      // read the fp32 tables.
      const at::Tensor cos32 = ang.cos().unsqueeze(0), sin32 = ang.sin().unsqueeze(0);
      const at::Tensor q = at::randn({1, tokens, heads * head_dim}, opt),
                       k = at::randn({1, tokens, kv_heads * head_dim}, opt);
      bench("rope q+k fwd, fp32 tables", (esize + 4.0) * qk + 4.0 * table, [&] {
        const at::NoGradGuard no_grad;
        kiln::ops::apply_rope_qk_(view(q, heads), view(k, kv_heads), cos32, sin32);
      });
    }
  }
  if (ops.find(",linear_ce,") != std::string::npos) {
    const at::Tensor h = (at::randn({tokens, ce_hidden}, opt) * 0.5).requires_grad_(true);
    const at::Tensor w = (at::randn({vocab, ce_hidden}, opt) * 0.02).requires_grad_(true);
    const at::Tensor y = at::randint(vocab, {tokens}, opt.dtype(at::kLong));
    bench(fmt::format("linear_ce fwd+bwd V={} H={}", vocab, ce_hidden), 0, [&] {
      const auto r = kiln::ops::linear_cross_entropy(h, w, y);
      torch::autograd::grad({r.loss}, {h, w});
    });
  }
  if (ops.find(",linear,") != std::string::npos) {
    // A projection as the trainer runs it: fp32 master weight, input and output in the compute
    // dtype under autocast (bf16/fp16), or all fp32.
    const at::Tensor x = at::randn({tokens, hidden}, opt).requires_grad_(true);
    const at::Tensor w = (at::randn({inter, hidden}, opt.dtype(at::kFloat)) * 0.02).requires_grad_(true);
    const at::Tensor gy = at::randn({tokens, inter}, opt);
    const bool autocast = dtype != at::kFloat;
    bench(fmt::format("linear fwd+bwd {}x{}x{}{}", tokens, hidden, inter, autocast ? " (autocast)" : ""), 0, [&] {
      at::Tensor y;
      if (autocast) {
        at::autocast::set_autocast_enabled(device.type(), true);
        at::autocast::set_autocast_dtype(device.type(), dtype);
      }
      y = kiln::ops::linear(x, w);
      at::autocast::set_autocast_enabled(device.type(), false);
      at::autocast::clear_cache();
      torch::autograd::grad({y}, {x, w}, {gy.to(y.scalar_type())});
    });
  }

  // --predict: the fraction of copy bandwidth the op's kernels can sustain by their machine code,
  // beside the measured one (predict.cpp); kiln's rows on a GPU only.
  const std::string dtype_name(kiln::dtype_name(dtype));
  auto predicted = [&](const Row& r) -> std::optional<double> {
    if (!c.predict || !r.has_bw || r.impl != "kiln") return std::nullopt;
    return predicted_copy_fraction(r.op.substr(0, r.op.find(' ')), dtype_name, device, copy_gbps);
  };
  if (!rows.empty()) {
    fmt::print("\n| op | impl | time ms | GB/s | of copy |{} peak extra MiB |\n|---|---|---:|---:|---:|{}---:|\n",
               c.predict ? " predicted |" : "", c.predict ? "---:|" : "");
  }
  out["tokens"] = tokens;
  out["hidden"] = hidden;
  out["intermediate"] = inter;
  out["vocab"] = vocab;
  out["ce_hidden"] = ce_hidden;
  out["results"] = nlohmann::json::array();
  for (const Row& r : rows) {
    const std::optional<double> pred = predicted(r);
    fmt::print("| {} | {} | {:.3f} | {} | {} |{} {:.1f} |\n", r.op, r.impl, r.ms,
               r.has_bw ? fmt::format("{:.1f}", r.gbps) : "-",
               r.has_bw ? fmt::format("{:.0f}%", 100 * r.copy_frac) : "-",
               !c.predict ? ""
               : pred     ? fmt::format(" {:.0f}% |", 100 * *pred)
                          : " - |",
               static_cast<double>(r.peak) / (1 << 20));
    out["results"].push_back({{"op", r.op},
                              {"impl", r.impl},
                              {"ms", r.ms},
                              {"gbps", r.has_bw ? r.gbps : 0.0},
                              {"copy_fraction", r.has_bw ? r.copy_frac : 0.0},
                              {"peak_extra_bytes", r.peak}});
    if (pred) out["results"].back()["predicted_copy_fraction"] = *pred;
  }
  // The GPU goals, checked against this run's own figures.
  for (size_t i = 0; i + 1 < rows.size(); i += 2) {
    const Row &k = rows[i], &a = rows[i + 1];
    if (k.op.rfind("linear_ce", 0) == 0) {
      fmt::print("linear_ce: kiln peak = {:.1f}% of aten, time = {:.2f}x aten (goal on GPU: <= 15%, <= 1.10x)\n",
                 100.0 * static_cast<double>(k.peak) / std::max<double>(1, static_cast<double>(a.peak)), k.ms / a.ms);
    } else if (k.op.rfind("rmsnorm", 0) == 0) {
      fmt::print("rmsnorm: kiln fwd+bwd at {:.0f}% of copy bandwidth (goal on GPU: >= 80%)\n", 100 * k.copy_frac);
    }
  }
}

}  // namespace kiln::bench
