// kiln-bench: each fused op against its ATen reference (the eager composition, differentiated
// by autograd) side by side in one run: forward + backward time, achieved bandwidth against a
// measured device-to-device copy, and peak extra memory. Runs on CPU (CPU figures) and CUDA.
//
// Bandwidth counts the bytes an ideal fused fwd+bwd must move (inputs read, outputs written
// once); the ATen path moves more, which is the point. Peak memory is measured above what the
// inputs already hold: the CUDA caching allocator's peak, or on CPU a counting wrapper around
// the CPU allocator installed before any tensor exists.
//
// `--ops attention` (opt-in: a sweep, not one case) compares causal attention on [B, H, T, D]
// inputs: kiln's ops::flash_attention against SDPA's flash and cuDNN backends (each called by its
// own ATen op, so each is named and none is silently replaced by another) on CUDA, or the CPU
// SDPA. Forward alone and forward+backward are timed; backward = (fwd+bwd) - fwd, as the
// flash-attention repository's benchmarks do. FLOPs follow that repository too: forward =
// 4 * B * Hq * T * T * D (two T x T x D matmuls per head), halved for the causal mask; backward =
// 2.5 x forward (five such matmuls). The sweep streams its rows and rewrites the JSON after each
// (T, D), so a run cut short by a time limit still leaves its figures.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#ifdef KILN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "cli.h"
#include "kiln/common/format.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/env.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/flash_attention.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/ops/rmsnorm.h"
#include "kiln/ops/rope.h"
#include "kiln/ops/swiglu.h"
#include "kiln/profile/cpu_allocator.h"
#include "kiln/profile/sweep.h"

namespace {

kiln::profile::CountingCpuAllocatorGuard* g_cpu_counter = nullptr;  // installed in main()

struct Memory {
  at::Device device;
  int64_t base = 0;
  void reset() {
#ifdef KILN_WITH_CUDA
    if (device.is_cuda()) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
      base = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
      return;
    }
#endif
    g_cpu_counter->reset_peak();
    base = g_cpu_counter->stats().current_bytes;
  }
  int64_t peak_extra() const {
#ifdef KILN_WITH_CUDA
    if (device.is_cuda()) {
      return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak - base;
    }
#endif
    return g_cpu_counter->stats().peak_bytes - base;
  }
};

void sync(const at::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

// Median seconds of fn over iters runs after warmup runs.
double time_it(const at::Device& d, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  sync(d);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    sync(d);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string op, impl;
  double ms = 0, gbps = 0, copy_frac = 0;
  int64_t peak = 0;
  bool has_bw = true;
};

// Seconds per call of forward and of forward+backward: the fastest of `iters` samples (noise on
// a shared machine only ever adds time), the two interleaved so that a slow phase hits both
// alike. Each sample repeats its call often enough to last about kMinSample seconds, so that
// microsecond cases (small CPU shapes, T = 512 on a GPU) are not lost in timer and
// synchronisation overhead; the repeat count comes from the fastest of a few probe calls (one
// probe slowed by the machine would otherwise shrink it). One warm-up call each first
// (allocator, cuDNN plan).
struct FwdBwdSeconds {
  double fwd = 0, fwd_bwd = 0;
};
FwdBwdSeconds time_fwd_bwd(const at::Device& d, int iters, const std::function<void()>& fwd,
                           const std::function<void()>& fwd_bwd) {
  constexpr double kMinSample = 0.01;
  auto timed = [&](const std::function<void()>& fn, int reps) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    sync(d);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto repeats = [&](const std::function<void()>& fn) {
    timed(fn, 1);
    double once = timed(fn, 1);
    if (once >= kMinSample) return 1;
    for (int i = 0; i < 2; ++i) once = std::min(once, timed(fn, 1));
    return static_cast<int>(std::clamp(std::ceil(kMinSample / once), 1.0, 1000.0));
  };
  const int reps_fwd = repeats(fwd), reps_fwd_bwd = repeats(fwd_bwd);
  std::vector<double> tf, tb;
  for (int i = 0; i < iters; ++i) {
    tf.push_back(timed(fwd, reps_fwd) / reps_fwd);
    tb.push_back(timed(fwd_bwd, reps_fwd_bwd) / reps_fwd_bwd);
  }
  return {*std::min_element(tf.begin(), tf.end()), *std::min_element(tb.begin(), tb.end())};
}

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

struct AttentionSweep {
  std::vector<int64_t> seqlens, head_dims;
  int64_t batch = 0;  // 0: 16384 tokens / T on cuda, 1 on cpu
  int64_t heads = 0, kv_heads = 0;
  int iters = 1;
};

// kiln, then the SDPA implementations of this device (the first one that runs is the reference).
std::vector<AttentionImpl> attention_impls(bool cuda, bool gqa) {
  std::vector<AttentionImpl> impls;
  impls.push_back({"kiln",
                   [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                     return kiln::ops::flash_attention(q, k, v, {.causal = true});
                   },
                   false});
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

// The attention sweep: prints one table per (T, D), appends rows to out["attention"] and calls
// flush_json after each (T, D). Inputs are fresh N(0, 1) tensors per case, same for every impl.
void run_attention(const AttentionSweep& sw, const at::TensorOptions& opt, const std::string& dtype_name, Memory& mem,
                   nlohmann::json& out, const std::function<void()>& flush_json) {
  const at::Device device = opt.device();
  const bool cuda = device.is_cuda();
  const std::vector<AttentionImpl> impls = attention_impls(cuda, sw.kv_heads != sw.heads);
  const double tol = mismatch_tolerance(c10::typeMetaToScalarType(opt.dtype()));
  out["attention_setup"] = {{"heads", sw.heads},
                            {"kv_heads", sw.kv_heads},
                            {"causal", true},
                            {"iters", sw.iters},
                            {"seqlens", sw.seqlens},
                            {"head_dims", sw.head_dims},
                            {"flops", "forward = 4*B*Hq*T*T*D / 2 (causal); backward = 2.5 x forward"},
                            {"mismatch_tolerance", tol}};
  out["attention"] = nlohmann::json::array();
  out["attention_ratios"] = nlohmann::json::array();
  fmt::print(
      "\nattention: kiln = ops::flash_attention (CUDA kernel where it applies, else the blocked ATen "
      "reference); causal, Hq = {}, Hkv = {}, {}; backward = (fwd+bwd) - fwd; FLOPs: fwd = 4*B*Hq*T*T*D / 2, "
      "bwd = 2.5 x fwd\n",
      sw.heads, sw.kv_heads, dtype_name);
  int mismatches = 0;
  std::vector<std::string> summary;
  std::string summary_versus;
  for (const int64_t t : sw.seqlens) {
    for (const int64_t d : sw.head_dims) {
      const int64_t b = sw.batch > 0 ? sw.batch : (cuda ? std::max<int64_t>(1, 16384 / t) : 1);
      const double flops_fwd = attention_fwd_flops(b, sw.heads, t, d, true), flops_bwd = kBwdFlopFactor * flops_fwd;
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
      // The goal: kiln at least the SDPA flash backend's TFLOP/s (on CPU: the CPU SDPA's).
      const std::string versus = cuda ? "sdpa flash" : "sdpa (cpu)";
      const AttentionRow& kiln_row = rows[0];
      const auto other =
          std::find_if(rows.begin(), rows.end(), [&](const AttentionRow& r) { return r.impl == versus; });
      if (kiln_row.error.empty() && other != rows.end() && other->error.empty()) {
        const std::string rf = ratio_text(kiln_row.tflops_fwd, other->tflops_fwd);
        const std::string rb = ratio_text(kiln_row.tflops_bwd, other->tflops_bwd);
        fmt::print("\nkiln / {} TFLOP/s: fwd {}, bwd {}{}\n", versus, rf, rb,
                   cuda ? " (goal on an H200: >= 1.0 both)" : "");
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
               cuda ? " (goal on an H200: >= 1.0 forward and backward)" : "");
    for (const std::string& line : summary) fmt::print("{}\n", line);
  }
  if (mismatches > 0) fmt::print("\nWARNING: {} output mismatch(es) against SDPA, see above\n", mismatches);
}

}  // namespace

// `--ops comm`, under torchrun or srun: the bus bandwidth of the collectives data parallelism
// uses, on the data group kiln trains with (NCCL on CUDA, Gloo on CPU), as nccl-tests defines
// it: algbw = S / t for a buffer of S bytes (all_reduce: in = out = S; reduce_scatter: in = S;
// all_gather: out = S), busbw = algbw x 2(n-1)/n for all_reduce and x (n-1)/n for the other two.
void run_comm(at::TensorOptions opt, int iters, int64_t max_bytes, nlohmann::json& out) {
  const auto env = kiln::dist::read_dist_env();
  if (!env.distributed()) {
    throw std::invalid_argument(
        "--ops comm needs a launcher: torchrun --no-python --nproc-per-node N kiln-bench --ops comm (or srun)");
  }
  if (opt.device().is_cuda()) {  // one GPU per process, as the trainer
    const at::Device mine(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    at::accelerator::setDeviceIndex(mine.index());
    opt = opt.device(mine);
  }
  auto comm = kiln::dist::connect(env, {.cuda = opt.device().is_cuda()});
  const int n = comm->world_size();
  const bool main_rank = comm->rank() == 0;
  const int64_t esize = static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(opt.dtype())));
  if (main_rank) {
    fmt::print(
        "\ncollectives on the {} group, {} ranks ({}), {}; median of {} (nccl-tests' busbw)\n\n"
        "| bytes | all_reduce ms | busbw GB/s | reduce_scatter ms | busbw GB/s | all_gather ms | busbw GB/s |\n"
        "|---:|---:|---:|---:|---:|---:|---:|\n",
        comm->backend(), n, env.launcher, opt.device().str(), iters);
  }
  out["comm"] = nlohmann::json::array();
  const double ar = 2.0 * (n - 1) / n, rs = static_cast<double>(n - 1) / n;
  for (int64_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
    const int64_t elems = bytes / esize / n * n;  // divisible by the world size
    at::Tensor full = at::ones({elems}, opt), part = at::ones({elems / n}, opt);
    auto time = [&](const std::function<std::unique_ptr<kiln::dist::Pending>()>& launch) {
      launch()->wait();  // warm-up (and, for NCCL, the communicator's creation)
      std::vector<double> samples;
      for (int i = 0; i < iters; ++i) {
        comm->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        launch()->wait();
        sync(opt.device());
        samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(samples.begin(), samples.end());
      // The job's time is its slowest rank's.
      return static_cast<double>(comm->host_max({static_cast<int64_t>(samples[samples.size() / 2] * 1e9)})[0]) / 1e9;
    };
    const double t_ar = time([&] { return comm->all_reduce_sum(full); });
    const double t_rs = time([&] { return comm->reduce_scatter_sum(part, full); });
    const double t_ag = time([&] { return comm->all_gather(full, part); });
    const double size = static_cast<double>(elems * esize);
    auto bus = [&](double t, double factor) { return size / t / 1e9 * factor; };
    if (main_rank) {
      fmt::print("| {} | {:.3f} | {:.2f} | {:.3f} | {:.2f} | {:.3f} | {:.2f} |\n", kiln::human_bytes(size), t_ar * 1e3,
                 bus(t_ar, ar), t_rs * 1e3, bus(t_rs, rs), t_ag * 1e3, bus(t_ag, rs));
    }
    out["comm"].push_back({{"bytes", size},
                           {"world_size", n},
                           {"backend", comm->backend()},
                           {"all_reduce_s", t_ar},
                           {"all_reduce_busbw_gbps", bus(t_ar, ar)},
                           {"reduce_scatter_s", t_rs},
                           {"reduce_scatter_busbw_gbps", bus(t_rs, rs)},
                           {"all_gather_s", t_ag},
                           {"all_gather_busbw_gbps", bus(t_ag, rs)}});
  }
}

int main(int argc, char** argv) {
  kiln::profile::CountingCpuAllocatorGuard counter;  // before any tensor exists, so all are counted
  g_cpu_counter = &counter;

  cxxopts::Options options("kiln-bench",
                           "kiln fused ops vs their ATen reference: time, GB/s, peak memory; with --ops attention, "
                           "kiln's flash attention vs SDPA backends: fwd/bwd time, TFLOP/s, peak memory");
  // clang-format off
  options.add_options()
    ("device", "cpu or cuda (default: cuda when present)", cxxopts::value<std::string>()->default_value(""))
    ("dtype", "fp32, bf16 or fp16 (default: bf16 on cuda, fp32 on cpu)", cxxopts::value<std::string>()->default_value(""))
    ("ops", "comma list of rmsnorm, swiglu, rope, linear_ce, linear, attention, comm (attention and comm only when named; comm under torchrun/srun); linear: tokens x hidden -> intermediate, fp32 weight under --dtype autocast", cxxopts::value<std::string>()->default_value("rmsnorm,swiglu,rope,linear_ce,linear"))
    ("comm-max-bytes", "comm: largest buffer, from 1 MiB up by x4; default 1 GiB on cuda, 64 MiB on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("tokens", "rows (batch x sequence); default 8192 on cuda, 1024 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("hidden", "hidden size; default 4096 on cuda, 1024 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("intermediate", "MLP width; default 14336 on cuda, 2816 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("vocab", "vocabulary for linear_ce; default 128256 on cuda, 32000 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("ce-hidden", "hidden size for linear_ce; default 2048 (Llama 3.2 1B's head) on cuda, 512 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("seqlens", "attention: comma list of sequence lengths T; default 512,1024,2048,4096,8192 on cuda, 128,256 on cpu", cxxopts::value<std::string>()->default_value(""))
    ("head-dims", "attention: comma list of head dims D", cxxopts::value<std::string>()->default_value("64,128"))
    ("batch", "attention: batch B; default 16384 tokens / T (at least 1) on cuda, 1 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("heads", "attention: query heads; default 16 on cuda, 4 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("kv-heads", "attention: key/value heads, dividing --heads (GQA); default = heads", cxxopts::value<int64_t>()->default_value("0"))
    ("iters", "timed iterations per case (median reported; attention: fastest sample, each repeating the call for about 10 ms)", cxxopts::value<int>()->default_value("5"))
    ("json", "also write the results to this JSON file", cxxopts::value<std::string>()->default_value(""))
    ("h,help", "print this help");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    const at::Device device = kiln::cli::device(args["device"].as<std::string>());
    const bool cuda = device.is_cuda();
    const std::string dev_name = cuda ? "cuda" : "cpu";
    std::string dtype_name = args["dtype"].as<std::string>();
    if (dtype_name.empty()) dtype_name = cuda ? "bf16" : "fp32";
    at::ScalarType dtype;
    if (dtype_name == "fp32") {
      dtype = at::kFloat;
    } else if (dtype_name == "bf16") {
      dtype = at::kBFloat16;
    } else if (dtype_name == "fp16") {
      dtype = at::kHalf;
    } else {
      throw std::invalid_argument("--dtype must be fp32, bf16 or fp16, got '" + dtype_name + "'");
    }
    auto pick = [&](const char* key, int64_t gpu, int64_t cpu) {
      const int64_t v = args[key].as<int64_t>();
      if (v < 0) throw std::invalid_argument(fmt::format("--{} must be positive, got {}", key, v));
      return v > 0 ? v : (cuda ? gpu : cpu);
    };
    const int64_t tokens = pick("tokens", 8192, 1024), hidden = pick("hidden", 4096, 1024);
    const int64_t inter = pick("intermediate", 14336, 2816), vocab = pick("vocab", 128256, 32000);
    const int64_t ce_hidden = pick("ce-hidden", 2048, 512);
    const int iters = std::max(1, args["iters"].as<int>());
    const std::string ops = "," + args["ops"].as<std::string>() + ",";
    for (size_t start = 1; start < ops.size();) {
      const size_t end = ops.find(',', start);
      const std::string name = ops.substr(start, end - start);
      if (name != "rmsnorm" && name != "swiglu" && name != "rope" && name != "linear_ce" && name != "linear" &&
          name != "attention" && name != "comm") {
        throw std::invalid_argument("--ops: unknown op '" + name +
                                    "' (rmsnorm, swiglu, rope, linear_ce, linear, attention, comm)");
      }
      start = end + 1;
    }
    AttentionSweep sweep;
    const bool attention = ops.find(",attention,") != std::string::npos;
    if (attention) {
      const std::string seqlens = args["seqlens"].as<std::string>();
      sweep.seqlens = kiln::profile::parse_int_list(
          seqlens.empty() ? (cuda ? "512,1024,2048,4096,8192" : "128,256") : seqlens, "--seqlens");
      sweep.head_dims = kiln::profile::parse_int_list(args["head-dims"].as<std::string>(), "--head-dims");
      sweep.batch = pick("batch", 0, 0);
      sweep.heads = pick("heads", 16, 4);
      sweep.kv_heads = pick("kv-heads", sweep.heads, sweep.heads);
      if (sweep.heads % sweep.kv_heads != 0) {
        throw std::invalid_argument(
            fmt::format("--kv-heads ({}) must divide --heads ({})", sweep.kv_heads, sweep.heads));
      }
      sweep.iters = iters;
    }
    const at::TensorOptions opt = at::TensorOptions().device(device).dtype(dtype);
    const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
    at::manual_seed(0);

    // Device copy bandwidth: read + write of a buffer larger than the caches.
    const int64_t copy_bytes = cuda ? (int64_t{1} << 30) : (int64_t{1} << 27);
    double copy_gbps = 0;
    {
      const at::Tensor src = at::empty({copy_bytes}, opt.dtype(at::kByte)).fill_(1);
      at::Tensor dst = at::empty_like(src);
      const double s = time_it(device, iters, [&] { dst.copy_(src); });
      copy_gbps = 2.0 * static_cast<double>(copy_bytes) / s / 1e9;
    }
    if (kiln::dist::read_dist_env().rank == 0) {  // under a launcher (--ops comm), rank 0 reports
      fmt::print("kiln-bench on {} ({}), copy bandwidth {:.1f} GB/s, kernels compiled: {}\n", dev_name, dtype_name,
                 copy_gbps, kiln::ops::kernels_compiled() ? "yes" : "no");
    }

    std::vector<Row> rows;
    Memory mem{device};
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
      const int64_t head_dim = 128, heads = hidden / head_dim;
      const at::Tensor base = at::randn({1, tokens, heads * head_dim}, opt).requires_grad_(true);
      const at::Tensor ang =
          at::arange(tokens, opt.dtype(at::kFloat)).unsqueeze(1) * at::rand({head_dim}, opt.dtype(at::kFloat));
      const at::Tensor cos = ang.cos().to(dtype).unsqueeze(0), sin = ang.sin().to(dtype).unsqueeze(0);
      const at::Tensor gy = at::randn({1, heads, tokens, head_dim}, opt);
      // fwd: read + write x in place; bwd: read dy, write dx (tables are small)
      bench("rope fwd+bwd", 4.0 * tokens * hidden * esize, [&] {
        const at::Tensor x = (base * 1).view({1, tokens, heads, head_dim}).transpose(1, 2);
        const at::Tensor y = kiln::ops::apply_rope_(x, cos, sin);
        torch::autograd::grad({y}, {base}, {gy});
      });
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

    if (!rows.empty()) {
      fmt::print("\n| op | impl | time ms | GB/s | of copy | peak extra MiB |\n|---|---|---:|---:|---:|---:|\n");
    }
    nlohmann::json out = {{"device", dev_name}, {"dtype", dtype_name},    {"copy_gbps", copy_gbps},
                          {"tokens", tokens},   {"hidden", hidden},       {"intermediate", inter},
                          {"vocab", vocab},     {"ce_hidden", ce_hidden}, {"results", nlohmann::json::array()}};
    for (const Row& r : rows) {
      fmt::print("| {} | {} | {:.3f} | {} | {} | {:.1f} |\n", r.op, r.impl, r.ms,
                 r.has_bw ? fmt::format("{:.1f}", r.gbps) : "-",
                 r.has_bw ? fmt::format("{:.0f}%", 100 * r.copy_frac) : "-", static_cast<double>(r.peak) / (1 << 20));
      out["results"].push_back({{"op", r.op},
                                {"impl", r.impl},
                                {"ms", r.ms},
                                {"gbps", r.has_bw ? r.gbps : 0.0},
                                {"copy_fraction", r.has_bw ? r.copy_frac : 0.0},
                                {"peak_extra_bytes", r.peak}});
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
    const std::string json_path = args["json"].as<std::string>();
    auto flush_json = [&] {
      if (!json_path.empty()) kiln::io::write_file_atomic(json_path, out.dump(2) + "\n");
    };
    flush_json();
    std::fflush(stdout);
    if (attention) run_attention(sweep, opt, dtype_name, mem, out, flush_json);
    if (ops.find(",comm,") != std::string::npos) {
      run_comm(opt, iters, pick("comm-max-bytes", int64_t{1} << 30, int64_t{64} << 20), out);
      if (kiln::dist::read_dist_env().rank == 0) flush_json();
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-bench: {}\n", e.what());
    return 1;
  }
}
