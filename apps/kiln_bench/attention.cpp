// kiln-bench's `--ops attention` (opt-in: a sweep, not one case) compares causal attention on
// [B, H, T, D] inputs: kiln's ops::flash_attention against SDPA's flash and cuDNN backends (each
// called by its own ATen op, so each is named and none is silently replaced by another) on CUDA,
// or the CPU SDPA. Forward alone and forward+backward are timed; backward = (fwd+bwd) - fwd, as
// the flash-attention repository's benchmarks do. FLOPs follow that repository too: forward =
// 4 * B * Hq * T * T * D (two T x T x D matmuls per head), halved for the causal mask; backward =
// 2.5 x forward (five such matmuls). The sweep streams its rows and rewrites the JSON after each
// (T, D), so a run cut short by a time limit still leaves its figures.
// With --docs N each row holds N packed documents (segment ids): kiln's kernels skip the tile
// pairs of different documents, SDPA (which has no segment ids) gets the [B, 1, T, T] boolean
// mask through its public entry point, and FLOPs count only the documents' own causal triangles.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/flash_attention.h"

namespace kiln::bench {
namespace {

// Forward FLOPs of attention (see the file comment); backward is kBwdFlopFactor times this.
constexpr double kBwdFlopFactor = 2.5;
double attention_fwd_flops(int64_t b, int64_t hq, int64_t t, int64_t d, bool causal) {
  const double f = 4.0 * static_cast<double>(b) * static_cast<double>(hq) * static_cast<double>(t) *
                   static_cast<double>(t) * static_cast<double>(d);
  return causal ? f / 2 : f;
}

// |kiln - sdpa| above which the sweep prints a WARNING: a few units in the last place of the
// output dtype at the magnitudes random N(0, 1) inputs give (|out| < 4). A sanity check of the
// benchmarked configuration, not the accuracy test (that is tests/ops/test_flash_attention.cpp).
double mismatch_tolerance(at::ScalarType t) {
  if (t == at::kBFloat16) return 6e-2;
  if (t == at::kHalf) return 8e-3;
  return 1e-4;
}

// The message of an exception without c10's backtrace: first line, at most 120 characters, no
// '|' (it goes into a markdown table cell).
std::string short_reason(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  what = what.substr(0, what.find('\n'));
  std::replace(what.begin(), what.end(), '|', '/');
  return what.size() > 120 ? what.substr(0, 117) + "..." : what;
}

using AttentionFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

struct AttentionImpl {
  std::string name;
  AttentionFn fn;
  bool is_sdpa = true;
};

struct AttentionRow {
  std::string impl;
  std::string error;  // non-empty: not measured ("unsupported: ..." or "failed: ...")
  double ms_fwd = 0, ms_fwd_bwd = 0, ms_bwd = 0, tflops_fwd = 0, tflops_bwd = 0;
  int64_t peak_fwd = 0, peak_fwd_bwd = 0;
  std::optional<double> max_abs_diff;  // vs the reference SDPA output; none for the reference itself
  bool mismatch = false;
};

// Segment ids [B, T] of `docs` equal documents per row (the last takes the remainder).
at::Tensor document_ids(int64_t b, int64_t t, int64_t docs, const at::Device& device) {
  const int64_t len = std::max<int64_t>(1, t / docs);
  return at::clamp_max(at::arange(t, at::TensorOptions().dtype(at::kLong)) / len, docs - 1)
      .to(at::kInt)
      .unsqueeze(0)
      .expand({b, t})
      .contiguous()
      .to(device);
}

// The useful forward FLOPs of packed documents: each document's causal triangle.
double packed_fwd_flops(int64_t b, int64_t hq, int64_t t, int64_t d, int64_t docs) {
  const int64_t len = std::max<int64_t>(1, t / docs);
  double f = 0;
  for (int64_t i = 0; i < docs; ++i) {
    const int64_t l = i + 1 < docs ? len : t - len * (docs - 1);
    f += attention_fwd_flops(b, hq, l, d, true);
  }
  return f;
}

// kiln, then the SDPA implementations of this device (the first one that runs is the reference).
// With segment ids: kiln with them, and SDPA with the equivalent boolean mask.
std::vector<AttentionImpl> attention_impls(bool cuda, bool gqa, const at::Tensor& seg) {
  std::vector<AttentionImpl> impls;
  impls.push_back({"kiln",
                   [seg](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                     // kiln's kernels whatever the process-wide default (attention=aten: SDPA).
                     const kiln::ops::BackendScope kiln_kernels("kiln");
                     return kiln::ops::flash_attention(q, k, v, {.causal = true, .segment_ids = seg});
                   },
                   false});
  if (seg.defined()) {
    const int64_t t = seg.size(1);
    const at::Tensor causal = at::ones({t, t}, seg.options().dtype(at::kBool)).tril();
    const at::Tensor mask = (seg.unsqueeze(2) == seg.unsqueeze(1)).logical_and(causal).unsqueeze(1);  // [B, 1, T, T]
    impls.push_back({"sdpa mask", [mask, gqa](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                       return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, std::nullopt,
                                                               /*enable_gqa=*/gqa);
                     }});
    return impls;
  }
  if (cuda) {
    impls.push_back({"sdpa flash", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                       return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, 0.0, /*is_causal=*/true));
                     }});
    impls.push_back({"sdpa cudnn", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                       return std::get<0>(at::_scaled_dot_product_cudnn_attention(
                           q, k, v, std::nullopt, /*compute_log_sumexp=*/true, 0.0, /*is_causal=*/true));
                     }});
  } else {
    impls.push_back({"sdpa (cpu)", [gqa](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                       return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true,
                                                               std::nullopt, /*enable_gqa=*/gqa);
                     }});
  }
  return impls;
}

// TFLOP/s with three significant digits below 10 (CPU and tiny cases), one decimal above.
std::string tflops_text(double x) {
  return x >= 10 ? fmt::format("{:.1f}", x) : fmt::format("{:.3g}", x);
}

std::string ratio_text(double num, double den) {
  return den > 0 && num > 0 ? fmt::format("{:.2f}x", num / den) : "-";
}

}  // namespace

void run_attention(const AttentionSweep& sw, const at::TensorOptions& opt, const std::string& dtype_name, Memory& mem,
                   nlohmann::json& out, const std::function<void()>& flush_json) {
  const at::Device device = opt.device();
  const bool cuda = device.is_cuda();
  const double tol = mismatch_tolerance(c10::typeMetaToScalarType(opt.dtype()));
  out["attention_setup"] = {
      {"heads", sw.heads},
      {"kv_heads", sw.kv_heads},
      {"causal", true},
      {"iters", sw.iters},
      {"seqlens", sw.seqlens},
      {"head_dims", sw.head_dims},
      {"docs", sw.docs},
      {"flops", sw.docs > 0 ? "forward = sum over documents of 4*B*Hq*L*L*D / 2; backward = 2.5 x forward"
                            : "forward = 4*B*Hq*T*T*D / 2 (causal); backward = 2.5 x forward"},
      {"mismatch_tolerance", tol}};
  out["attention"] = nlohmann::json::array();
  out["attention_ratios"] = nlohmann::json::array();
  fmt::print(
      "\nattention: kiln = ops::flash_attention (CUDA kernel where it applies, else the blocked ATen "
      "reference); causal, Hq = {}, Hkv = {}, {}{}; backward = (fwd+bwd) - fwd; FLOPs: fwd = 4*B*Hq*T*T*D / 2{}, "
      "bwd = 2.5 x fwd\n",
      sw.heads, sw.kv_heads, dtype_name,
      sw.docs > 0 ? fmt::format(", {} packed documents per row (SDPA: a [B, 1, T, T] mask)", sw.docs) : "",
      sw.docs > 0 ? " per document" : "");
  int mismatches = 0;
  std::vector<std::string> summary;
  std::string summary_versus;
  for (const int64_t t : sw.seqlens) {
    for (const int64_t d : sw.head_dims) {
      const int64_t b = sw.batch > 0 ? sw.batch : (cuda ? std::max<int64_t>(1, 16384 / t) : 1);
      const double flops_fwd =
          sw.docs > 0 ? packed_fwd_flops(b, sw.heads, t, d, sw.docs) : attention_fwd_flops(b, sw.heads, t, d, true);
      const double flops_bwd = kBwdFlopFactor * flops_fwd;
      const at::Tensor seg = sw.docs > 0 ? document_ids(b, t, sw.docs, device) : at::Tensor();
      const std::vector<AttentionImpl> impls = attention_impls(cuda, sw.kv_heads != sw.heads, seg);
      const at::Tensor q = at::randn({b, sw.heads, t, d}, opt).requires_grad_(true);
      const at::Tensor k = at::randn({b, sw.kv_heads, t, d}, opt).requires_grad_(true);
      const at::Tensor v = at::randn({b, sw.kv_heads, t, d}, opt).requires_grad_(true);
      const at::Tensor gout = at::randn({b, sw.heads, t, d}, opt);

      // Sanity first: every impl's output once; the first SDPA output that exists is the reference.
      std::vector<AttentionRow> rows;
      std::vector<at::Tensor> outputs;
      std::string reference;
      at::Tensor ref_out;
      for (const AttentionImpl& impl : impls) {
        AttentionRow r{impl.name};
        at::Tensor o;
        try {
          o = impl.fn(q, k, v).detach().to(at::kFloat);
          sync(device);
        } catch (const std::exception& e) {
          r.error = (impl.is_sdpa ? "unsupported: " : "failed: ") + short_reason(e);
        }
        if (impl.is_sdpa && o.defined() && !ref_out.defined()) {
          ref_out = o;
          reference = impl.name;
        }
        rows.push_back(r);
        outputs.push_back(o);
      }
      std::vector<std::string> warnings;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!outputs[i].defined() || !ref_out.defined() || rows[i].impl == reference) continue;
        const double diff = (outputs[i] - ref_out).abs().max().item<double>();
        rows[i].max_abs_diff = diff;
        rows[i].mismatch = !(diff <= tol);
        if (rows[i].mismatch) {
          warnings.push_back(
              fmt::format("WARNING: T={} D={}: {} differs from {} by max |diff| = {:.3g} (tolerance "
                          "{:.3g} for {})",
                          t, d, rows[i].impl, reference, diff, tol, dtype_name));
        }
      }
      outputs.clear();
      ref_out = at::Tensor();

      for (size_t i = 0; i < rows.size(); ++i) {
        AttentionRow& r = rows[i];
        if (!r.error.empty()) continue;
        const AttentionFn& fn = impls[i].fn;
        const std::function<void()> fwd = [&] { fn(q, k, v); };
        const std::function<void()> fwd_bwd = [&] {
          const at::Tensor o = fn(q, k, v);
          torch::autograd::grad({o}, {q, k, v}, {gout});
        };
        try {
          const FwdBwdSeconds sec = time_fwd_bwd(device, sw.iters, fwd, fwd_bwd);
          r.ms_fwd = sec.fwd * 1e3;
          r.ms_fwd_bwd = sec.fwd_bwd * 1e3;
          mem.reset();
          fwd();
          sync(device);
          r.peak_fwd = mem.peak_extra();
          mem.reset();
          fwd_bwd();
          sync(device);
          r.peak_fwd_bwd = mem.peak_extra();
        } catch (const std::exception& e) {
          r.error = (impls[i].is_sdpa ? "unsupported: " : "failed: ") + short_reason(e);
          continue;
        }
        r.ms_bwd = r.ms_fwd_bwd - r.ms_fwd;
        r.tflops_fwd = flops_fwd / (r.ms_fwd * 1e-3) / 1e12;
        r.tflops_bwd = r.ms_bwd > 0 ? flops_bwd / (r.ms_bwd * 1e-3) / 1e12 : 0;
      }

      fmt::print("\n### T = {}, D = {}: B = {}, fwd {:.4g} GFLOP, bwd {:.4g} GFLOP\n\n", t, d, b, flops_fwd / 1e9,
                 flops_bwd / 1e9);
      fmt::print(
          "| impl | ms fwd | ms bwd | TFLOP/s fwd | TFLOP/s bwd | peak extra MiB (fwd+bwd) | max abs diff vs {} |\n"
          "|---|---:|---:|---:|---:|---:|---:|\n",
          reference.empty() ? "sdpa" : reference);
      for (const AttentionRow& r : rows) {
        const std::string diff = r.impl == reference ? "reference"
                                 : r.max_abs_diff ? fmt::format("{:.3g}{}", *r.max_abs_diff, r.mismatch ? " (!)" : "")
                                                  : "-";
        if (!r.error.empty()) {
          fmt::print("| {} | {} | | | | | |\n", r.impl, r.error);
        } else {
          fmt::print("| {} | {:.3f} | {:.3f} | {} | {} | {:.1f} | {} |\n", r.impl, r.ms_fwd, r.ms_bwd,
                     tflops_text(r.tflops_fwd), r.ms_bwd > 0 ? tflops_text(r.tflops_bwd) : "-",
                     static_cast<double>(r.peak_fwd_bwd) / (1 << 20), diff);
        }
        nlohmann::json j = {{"seqlen", t},
                            {"docs", sw.docs},
                            {"head_dim", d},
                            {"batch", b},
                            {"heads", sw.heads},
                            {"kv_heads", sw.kv_heads},
                            {"impl", r.impl},
                            {"supported", r.error.empty()},
                            {"error", r.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.error)},
                            {"flops_fwd", flops_fwd},
                            {"flops_bwd", flops_bwd},
                            {"reference", reference.empty() ? nlohmann::json(nullptr) : nlohmann::json(reference)},
                            {"max_abs_diff_vs_sdpa", r.max_abs_diff ? nlohmann::json(*r.max_abs_diff) : nullptr},
                            {"mismatch", r.mismatch}};
        if (r.error.empty()) {
          j["ms_fwd"] = r.ms_fwd;
          j["ms_bwd"] = r.ms_bwd;
          j["ms_fwd_bwd"] = r.ms_fwd_bwd;
          j["tflops_fwd"] = r.tflops_fwd;
          j["tflops_bwd"] = r.ms_bwd > 0 ? nlohmann::json(r.tflops_bwd) : nullptr;
          j["peak_extra_bytes"] = r.peak_fwd_bwd;
          j["peak_extra_bytes_fwd"] = r.peak_fwd;
        }
        out["attention"].push_back(j);
      }
      // The goals: kiln at least the SDPA flash backend's TFLOP/s (on CPU: the CPU SDPA's); with
      // packed documents twice SDPA with its mask.
      const std::string versus = sw.docs > 0 ? "sdpa mask" : cuda ? "sdpa flash" : "sdpa (cpu)";
      const std::string goal = !cuda         ? ""
                               : sw.docs > 0 ? " (goal on an H200: >= 2.0 both)"
                                             : " (goal on an H200: >= 1.0 both)";
      const AttentionRow& kiln_row = rows[0];
      const auto other =
          std::find_if(rows.begin(), rows.end(), [&](const AttentionRow& r) { return r.impl == versus; });
      if (kiln_row.error.empty() && other != rows.end() && other->error.empty()) {
        const std::string rf = ratio_text(kiln_row.tflops_fwd, other->tflops_fwd);
        const std::string rb = ratio_text(kiln_row.tflops_bwd, other->tflops_bwd);
        fmt::print("\nkiln / {} TFLOP/s: fwd {}, bwd {}{}\n", versus, rf, rb, goal);
        summary.push_back(fmt::format("| {} | {} | {} | {} |", t, d, rf, rb));
        summary_versus = versus;
        out["attention_ratios"].push_back({{"seqlen", t},
                                           {"head_dim", d},
                                           {"versus", versus},
                                           {"fwd", kiln_row.tflops_fwd / other->tflops_fwd},
                                           {"bwd", kiln_row.tflops_bwd > 0 && other->tflops_bwd > 0
                                                       ? nlohmann::json(kiln_row.tflops_bwd / other->tflops_bwd)
                                                       : nullptr}});
      }
      for (const std::string& w : warnings) fmt::print("{}\n", w);
      mismatches += static_cast<int>(warnings.size());
      std::fflush(stdout);  // the sweep may be cut by a time limit: keep what is measured
      flush_json();
    }
  }
  if (!summary.empty()) {
    fmt::print("\n## kiln / {} TFLOP/s{}\n\n| T | D | fwd | bwd |\n|---:|---:|---:|---:|\n", summary_versus,
               !cuda         ? ""
               : sw.docs > 0 ? " (goal on an H200: >= 2.0 forward and backward)"
                             : " (goal on an H200: >= 1.0 forward and backward)");
    for (const std::string& line : summary) fmt::print("{}\n", line);
  }
  if (mismatches > 0) fmt::print("\nWARNING: {} output mismatch(es) against SDPA, see above\n", mismatches);
}

}  // namespace kiln::bench
