// The traffic model (cost/traffic.h). References, each independent of traffic.cpp's formulas:
//   - bytes of RMSNorm, of one projection GEMM and of the fused loss head derived by hand here,
//     op by op from the kernels and ops they model, as literal arithmetic on a small config;
//   - the matmul FLOPs against cost/flops.h's per-token totals (forward, and x3 for training);
//   - the FLOPs of the GEMMs the tiny model actually executes, counted from the shapes of the
//     aten::mm / addmm / bmm events (and of SDPA's op) in a Kineto trace of one forward and backward
//     on the CPU;
//   - the ridge point of a GEMM on an A100 (312 TFLOP/s bf16, 2039 GB/s) solved by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "kiln/common/torch_internals.h"
#include "kiln/cost/flops.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/memory.h"
#include "kiln/cost/traffic.h"
#include "kiln/model/llama.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/train/kernel_choices.h"
#include "support.h"

namespace {

using kiln::cost::Pass;
using kiln::cost::RunDescription;
using kiln::cost::TrafficReport;

// vocab 1000, hidden 64, MLP 128, 2 layers, 4 heads of 16 (q = 64), 2 KV heads (kv = 32), untied.
kiln::model::LlamaConfig small_config() {
  kiln::model::LlamaConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 1024;
  c.tie_word_embeddings = false;
  c.source = "test";
  return c;
}

// kiln's CUDA step in bf16 with every fused op, the loss head's chunks fixed at 64 rows.
RunDescription small_options() {
  RunDescription o;
  o.batch = 2;
  o.cutoff_len = 128;  // N = 256 tokens
  o.dtype = "bf16";
  o.kernels.fused_rmsnorm = o.kernels.fused_swiglu = o.kernels.fused_loss_head = true;
  o.kernels.loss_head_low_precision = true;
  o.kernels.loss_chunk_tokens = [](int64_t, int64_t, int64_t) { return int64_t{64}; };
  o.kernels.attention = "flash";
  return o;
}

}  // namespace

TEST_CASE("traffic: RMSNorm, one projection GEMM and the fused loss head move the bytes derived by hand", "[traffic]") {
  const TrafficReport r = kiln::cost::traffic_model(small_config(), small_options());
  // N = 2 x 128 = 256 tokens, H = 64: one fp32 [N, H] tensor is 256 * 64 * 4 = 65536 bytes.

  // kiln's RMSNorm kernel on the fp32 residual stream. Forward: read x (65536) and the weight
  // (64 * 4 = 256); write y (65536) and rstd, one fp32 per row (256 * 4 = 1024).
  const auto* norm_fwd = r.find("input RMSNorm", Pass::kForward);
  REQUIRE(norm_fwd != nullptr);
  CHECK(norm_fwd->kiln.bytes == 65536 + 256 + 65536 + 1024);
  CHECK(norm_fwd->repeats == 2);  // two layers, one micro-batch
  // Backward: read x (65536), the weight (256), rstd (1024) and dy (65536); write dx (65536) and
  // dweight (256). rstd is saved, not recomputed.
  CHECK(r.find("input RMSNorm", Pass::kBackward)->kiln.bytes == 65536 + 256 + 1024 + 65536 + 65536 + 256);
  // HF's RMSNorm forward as six whole-tensor ops on fp32:
  //   x.pow(2)            R 65536        W 65536
  //   .mean(-1)           R 65536        W 1024
  //   + eps               R 1024         W 1024
  //   rsqrt               R 1024         W 1024
  //   x * r               R 65536 + 1024 W 65536
  //   weight * that       R 65536 + 256  W 65536
  CHECK(norm_fwd->eager.bytes == (65536 + 65536) + (65536 + 1024) + (1024 + 1024) + (1024 + 1024) +
                                     (65536 + 1024 + 65536) + (65536 + 256 + 65536));

  // q_proj in bf16: x [256, 64], W [64, 64], y [256, 64], 2 bytes each.
  // Forward: read x (256*64*2 = 32768) and W (64*64*2 = 8192), write y (32768).
  const auto* q_fwd = r.find("q_proj", Pass::kForward);
  CHECK(q_fwd->kiln.bytes == 32768 + 8192 + 32768);
  CHECK(q_fwd->kiln.gemm_flops == 2.0 * 256 * 64 * 64);
  // Backward: dx = dy W (read dy 32768, W 8192; write dx 32768) and dW = dy^T x (read dy 32768,
  // x 32768; write dW 8192). The same in the eager step: a GEMM is a GEMM.
  const auto* q_bwd = r.find("q_proj", Pass::kBackward);
  CHECK(q_bwd->kiln.bytes == (32768 + 8192 + 32768) + (32768 + 32768 + 8192));
  CHECK(q_bwd->eager.bytes == q_bwd->kiln.bytes);
  CHECK(q_bwd->kiln.gemm_flops == 2 * 2.0 * 256 * 64 * 64);

  // The fused loss head: N = 256 rows, H = 64, V = 1000, chunks of 64 rows (4 chunks), bf16
  // matmuls, fp32 hidden states and weight. Sizes: hidden fp32 65536, bf16 32768; weight fp32
  // 256000, bf16 128000; one chunk's rows bf16 64*64*2 = 8192; one chunk's logits bf16
  // 64*1000*2 = 128000; the fp32 weight-gradient accumulator 256000.
  // Forward (ops/linear_cross_entropy.cpp, linear_cross_entropy + chunked_pass):
  //   hidden.to(bf16)                            R 65536   W 32768
  //   weight.to(bf16)                            R 256000  W 128000
  //   labels shifted (cat of int64 rows)         R 2048    W 2048
  //   per chunk: logits = h_r W^T                R 8192 + 128000  W 128000     (x4)
  //              loss kernel (in place)          R 128000 + 64*8  W 128000 + 64*8 (loss, lse)  (x4)
  const double fwd = (65536 + 32768) + (256000 + 128000) + (2048 + 2048) + 4 * (8192 + 128000 + 128000) +
                     4 * (128000 + 512 + 128000 + 512);
  const auto* head_fwd = r.find("LM head + loss", Pass::kForward);
  CHECK(head_fwd->kiln.bytes == fwd);
  // The gradients, formed in the same forward call (attributed to backward) and scaled in backward:
  //   accumulator zeroed (fp32)                  W 256000
  //   per chunk: dh_r = G W                      R 128000 + 128000  W 8192     (x4)
  //              acc += G^T h_r (fp32 out)       R 128000 + 8192 + 256000  W 256000  (x4)
  //   grad_weight = acc.to(bf16)                 R 256000  W 128000
  //   backward: grad_hidden * g, grad_weight * g R 32768 + 128000  W 32768 + 128000
  //   casts' backward to fp32: hidden, weight    R 32768 + 128000  W 65536 + 256000
  const double bwd = 256000 + 4 * (128000 + 128000 + 8192) + 4 * (128000 + 8192 + 256000 + 256000) + (256000 + 128000) +
                     (32768 + 128000 + 32768 + 128000) + (32768 + 128000 + 65536 + 256000);
  CHECK(r.find("LM head + loss", Pass::kBackward)->kiln.bytes == bwd);
  // FLOPs: 2 N V H forward, twice that for the two gradient GEMMs; nothing recomputed.
  CHECK(head_fwd->kiln.gemm_flops == 2.0 * 256 * 1000 * 64);
  CHECK(r.find("LM head + loss", Pass::kBackward)->kiln.gemm_flops == 4.0 * 256 * 1000 * 64);
}

TEST_CASE("traffic: the rows' matmul FLOPs add up to cost/flops.h's totals", "[traffic]") {
  for (const std::string preset : {"llama-100m", "llama-3.2-1b", "tiny"}) {
    const auto config = kiln::model::load_llama_config(preset);
    for (const std::string recompute : {"none", "full", "selective", "every_n"}) {
      for (const std::string dtype : {"bf16", "fp32"}) {
        RunDescription o;
        o.batch = 4;
        o.cutoff_len = 512;
        o.gradient_accumulation_steps = 3;
        o.dtype = dtype;
        o.recompute = recompute;
        o.every = 2;
        o.kernels = kiln::train::kernel_choices("kiln", dtype, /*cuda=*/true);
        o.kernels.attention = dtype == "fp32" ? "sdpa" : "flash";
        const TrafficReport r = kiln::cost::traffic_model(config, o);
        const auto per_token = kiln::cost::flops_per_token(config, o.cutoff_len);
        const double tokens = 4.0 * 512 * 3;
        CAPTURE(preset, recompute, dtype);
        // Model FLOPs: forward() per token in the forward rows, twice it in the backward rows.
        double fwd = 0, bwd = 0, matmul_fwd = 0, matmul_bwd = 0;
        for (const auto& row : r.rows) {
          if (row.pass == Pass::kForward) fwd += row.model_flops * row.repeats;
          if (row.pass == Pass::kBackward) bwd += row.model_flops * row.repeats;
          // Executed GEMM FLOPs outside the attention core (which recomputes QK^T in backward).
          if (row.component == "attention core" || row.component == "RoPE tables (cos, sin)") continue;
          if (row.pass == Pass::kForward) matmul_fwd += row.kiln.gemm_flops * row.repeats;
          if (row.pass == Pass::kBackward) matmul_bwd += row.kiln.gemm_flops * row.repeats;
        }
        CHECK(fwd == Approx(per_token.forward() * tokens).epsilon(1e-12));
        CHECK(bwd == Approx(2 * per_token.forward() * tokens).epsilon(1e-12));
        CHECK(r.model_flops_step() == Approx(per_token.train() * tokens).epsilon(1e-12));
        CHECK(matmul_fwd == Approx(per_token.matmul_forward * tokens).epsilon(1e-12));
        CHECK(matmul_bwd == Approx(2 * per_token.matmul_forward * tokens).epsilon(1e-12));
        // Recomputation is executed work only: full recomputation runs every layer's matmuls
        // again, which with the LM head outside the layers is less than flops.h's x4.
        double recomputed = 0;
        for (const auto& row : r.rows) {
          if (row.pass == Pass::kRecompute) {
            CHECK(row.model_flops == 0);
            recomputed += row.kiln.gemm_flops * row.repeats;
          }
        }
        const double layer_matmuls =
            (per_token.matmul_forward - 2.0 * config.vocab_size * config.hidden_size + per_token.attention_forward) *
            tokens;
        if (recompute == "full") CHECK(recomputed == Approx(layer_matmuls).epsilon(1e-12));
        if (recompute == "none" || recompute == "selective") CHECK(recomputed == 0);
      }
    }
  }
}

namespace {

struct TracedGemm {
  std::string name;
  double ts = 0, dur = 0;
  int64_t tid = 0;
  std::vector<int64_t> dims;  // every dimension of the operands
  double flops = 0;
};

std::vector<int64_t> shape(const nlohmann::json& dims, size_t i) {
  return dims.at(i).get<std::vector<int64_t>>();
}

}  // namespace

// The tiny preset's forward and backward on the CPU in fp32, as the trainer runs it (kiln kernels,
// the fused loss head), recorded by LibTorch's Kineto profiler with input shapes
// (torch_internals::KinetoTrace, kiln-profile sweep --trace's wrapper). LibTorch's own FLOP counting
// (ProfilerConfig's with_flops, KinetoEvent::flops) is reachable only through torch::profiler::impl,
// which kiln confines to common/torch_internals, whose trace records shapes, not FLOPs; so FLOPs are
// counted here from the shapes of the executed matmul ops: 2 M K N per aten::mm / addmm / addmm_,
// 2 b M K N per bmm / baddbmm, grouped by the dimensions that name their component.
namespace {

void check_traced_gemm_flops(const std::string& preset) {
  INFO(preset);
  const auto config = kiln::model::load_llama_config(preset);
  // T = 24 (48 rows) differs from every width of tiny (d 32, kv 64, ...) and llama-100m (768, 256,
  // 2048, 32000), so a GEMM's dimensions name its component.
  const int64_t batch = 2, seq = 24;
  const kiln::ops::BackendScope kernels("kiln");
  kiln::model::LlamaForCausalLM model(config);
  model->fused_lm_loss = true;
  const at::Tensor ids = at::randint(config.vocab_size, {batch, seq}, at::kLong);
  const auto dir = kiln::test::scratch_dir("traffic_trace_" + preset);
  const std::string path = (dir / "trace.json").string();
  {
    kiln::torch_internals::KinetoTrace trace(/*cuda=*/false);
    model->forward(ids, ids).loss.backward();
    trace.save(path);
  }
  std::ifstream in(path);
  REQUIRE(in);
  const auto j = nlohmann::json::parse(in);

  const std::set<std::string> mm = {"aten::mm", "aten::addmm", "aten::addmm_"};
  const std::set<std::string> bmm = {"aten::bmm", "aten::baddbmm", "aten::baddbmm_"};
  std::vector<TracedGemm> gemms;
  std::vector<int64_t> sdpa_q;  // [B, heads, T, d] of SDPA's forward op
  int sdpa_fwd = 0, sdpa_bwd = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.value("ph", "") != "X" || !e.contains("args") || !e["args"].contains("Input Dims")) continue;
    const std::string name = e.value("name", "");
    const auto& dims = e["args"]["Input Dims"];
    if (name.find("scaled_dot_product") != std::string::npos && name.find("attention_for_cpu") != std::string::npos) {
      if (name.find("backward") != std::string::npos) {
        ++sdpa_bwd;
      } else {
        ++sdpa_fwd;
        sdpa_q = shape(dims, 0);
      }
      continue;
    }
    const bool is_mm = mm.count(name) > 0, is_bmm = bmm.count(name) > 0;
    if (!is_mm && !is_bmm) continue;
    TracedGemm g;
    g.name = name;
    g.ts = e.value("ts", 0.0);
    g.dur = e.value("dur", 0.0);
    g.tid = e.value("tid", int64_t{0});
    const size_t first = name == "aten::mm" || name == "aten::bmm" ? 0 : 1;  // addmm's self comes first
    const auto a = shape(dims, first), b = shape(dims, first + 1);
    REQUIRE(a.size() == (is_bmm ? 3u : 2u));
    REQUIRE(b.size() == a.size());
    const double batches = is_bmm ? static_cast<double>(a[0]) : 1.0;
    const int64_t m = a[a.size() - 2], k = a[a.size() - 1], n = b[b.size() - 1];
    REQUIRE(b[b.size() - 2] == k);
    g.flops = 2.0 * batches * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
    g.dims = {m, k, n};
    gemms.push_back(g);
  }
  // An op nested in another counted one (an addmm_ calling addmm, say) is the same GEMM.
  std::vector<TracedGemm> outer;
  for (const auto& g : gemms) {
    bool nested = false;
    for (const auto& o : gemms) {
      if (&o != &g && o.tid == g.tid && o.ts <= g.ts && g.ts + g.dur <= o.ts + o.dur && o.dur > g.dur) nested = true;
    }
    if (!nested) outer.push_back(g);
  }
  std::map<std::string, double> traced;  // component group -> executed FLOPs
  for (const auto& g : outer) {
    auto has = [&](int64_t x) { return std::find(g.dims.begin(), g.dims.end(), x) != g.dims.end(); };
    const std::string group = g.name.find("bmm") != std::string::npos ? "attention"
                              : has(config.vocab_size)                ? "head"
                              : has(config.intermediate_size)         ? "mlp"
                                                                      : "projections";
    traced[group] += g.flops;
  }
  REQUIRE(traced["projections"] > 0);
  REQUIRE(traced["mlp"] > 0);
  REQUIRE(traced["head"] > 0);

  RunDescription o;
  o.batch = batch;
  o.cutoff_len = seq;
  o.dtype = "fp32";
  o.kernels = kiln::train::kernel_choices("kiln", "fp32", /*cuda=*/false);
  // ATen's CPU SDPA: its fused flash kernel when the trace shows it, else the math backend's bmm.
  o.kernels.attention = sdpa_fwd > 0 ? "sdpa" : "math";
  const TrafficReport r = kiln::cost::traffic_model(config, o);
  auto model_gemm = [&](std::initializer_list<const char*> components) {
    double total = 0;
    for (const char* c : components) {
      total += r.kiln_step(c, Pass::kForward).gemm_flops + r.kiln_step(c, Pass::kBackward).gemm_flops;
    }
    return total;
  };
  CHECK(traced["projections"] == Approx(model_gemm({"q_proj", "k_proj", "v_proj", "o_proj"})).epsilon(1e-12));
  CHECK(traced["mlp"] == Approx(model_gemm({"gate_proj", "up_proj", "down_proj"})).epsilon(1e-12));
  CHECK(traced["head"] == Approx(model_gemm({"LM head + loss"})).epsilon(1e-12));
  if (sdpa_fwd > 0) {
    // The fused kernel's matmuls are not aten ops: its model FLOPs from the executed op's shape,
    // QK^T and PV over the causal half, 2 FLOPs per multiply-add, once per layer and micro-batch.
    CHECK(sdpa_fwd == config.num_hidden_layers);
    CHECK(sdpa_bwd == config.num_hidden_layers);
    REQUIRE(sdpa_q.size() == 4u);
    const double b = static_cast<double>(sdpa_q[0]), heads = static_cast<double>(sdpa_q[1]);
    const double t = static_cast<double>(sdpa_q[2]), d = static_cast<double>(sdpa_q[3]);
    const double fwd = 2.0 * 2.0 * b * heads * d * t * (t + 1) / 2 * static_cast<double>(config.num_hidden_layers);
    const auto* row = r.find("attention core", Pass::kForward);
    CHECK(row->model_flops * row->repeats == Approx(fwd).epsilon(1e-12));
    CHECK(r.find("attention core", Pass::kBackward)->model_flops * row->repeats == Approx(2 * fwd).epsilon(1e-12));
    CHECK(traced["attention"] == 0);
  } else {
    CHECK(traced["attention"] == Approx(model_gemm({"attention core"})).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("traffic: per-component GEMM FLOPs equal those of the ops tiny and llama-100m execute", "[traffic]") {
  check_traced_gemm_flops("tiny");
  check_traced_gemm_flops("llama-100m");
}

TEST_CASE("traffic: a GEMM turns compute-bound at the ridge point solved by hand", "[traffic]") {
  // A100-80GB, bf16: 312e12 FLOP/s over 2039e9 bytes/s: a ridge of 153.016... FLOP per byte.
  const auto a100 = kiln::cost::hardware_spec("A100-80GB");
  REQUIRE(a100);
  const kiln::cost::Roofline roof = kiln::cost::roofline(*a100, "bf16");
  const double ridge = 312e12 / 2039e9;
  CHECK(roof.ridge() == Approx(ridge).epsilon(1e-12));
  CHECK(roof.tensor_cores);
  // llama-100m's q_proj (H = q = 768) over N tokens in bf16: FLOPs 2 N H q, bytes 2 (N H + H q + N q),
  // intensity N H q / (N H + H q + N q). Setting it equal to the ridge R:
  //   N (H q - R (H + q)) = R H q   =>   N* = R H q / (H q - R (H + q))
  //   = 153.016 * 589824 / (589824 - 153.016 * 1536) = 90253... / 354791... = 254.4 tokens.
  const double hq = 768.0 * 768.0, n_star = ridge * hq / (hq - ridge * 1536.0);
  CHECK(n_star == Approx(254.4).margin(0.05));
  const auto config = kiln::model::load_llama_config("llama-100m");
  auto q_proj_bound = [&](int64_t batch, int64_t seq) {
    RunDescription o;
    o.batch = batch;
    o.cutoff_len = seq;
    o.kernels.attention = "sdpa";
    const TrafficReport r = kiln::cost::traffic_model(config, o);
    return roof.memory_bound(r.find("q_proj", Pass::kForward)->kiln);
  };
  // T grows at B = 1: memory-bound up to 254 tokens, compute-bound from 255.
  CHECK(q_proj_bound(1, 128));
  CHECK(q_proj_bound(1, 254));
  CHECK_FALSE(q_proj_bound(1, 255));
  CHECK_FALSE(q_proj_bound(1, 1024));
  // B grows at T = 16: 15 x 16 = 240 tokens memory-bound, 16 x 16 = 256 compute-bound.
  CHECK(q_proj_bound(15, 16));
  CHECK_FALSE(q_proj_bound(16, 16));
  // The modelled time is the larger of the two: FLOPs at the peak, bytes at the bandwidth.
  RunDescription o;
  o.batch = 1;
  o.cutoff_len = 1024;
  o.kernels.attention = "sdpa";
  const TrafficReport report = kiln::cost::traffic_model(config, o);  // the row points into it
  const auto* row = report.find("q_proj", Pass::kForward);
  REQUIRE(row);
  const double flops = 2.0 * 1024 * 768 * 768, bytes = 2.0 * (1024 * 768 + 768 * 768 + 1024 * 768);
  CHECK(roof.seconds(row->kiln) == Approx(std::max(flops / 312e12, bytes / 2039e9)).epsilon(1e-12));
}

TEST_CASE("traffic: gradient accumulation repeats the micro-batch rows, the optimizer runs once", "[traffic]") {
  const auto config = kiln::model::load_llama_config("llama-100m");
  RunDescription o;
  o.batch = 8;
  o.cutoff_len = 1024;
  o.kernels = kiln::train::kernel_choices("kiln", "bf16", /*cuda=*/true);
  o.kernels.attention = "flash";
  const TrafficReport one = kiln::cost::traffic_model(config, o);
  o.gradient_accumulation_steps = 8;
  const TrafficReport eight = kiln::cost::traffic_model(config, o);
  const double p = static_cast<double>(config.num_parameters());
  double step_once = 0;  // rows once per optimizer step
  for (const auto& row : one.rows) {
    if (row.pass == Pass::kStep) step_once += row.kiln_step().bytes;
  }
  // Fused AdamW reads param, grad and both moments and writes three of them (28 bytes per
  // parameter); clipping reads the gradients for the norm and scales them (12).
  CHECK(step_once == Approx(40 * p).epsilon(1e-12));
  // Eight micro-batches: eight times every forward and backward row (the weights re-cast and
  // re-read each time), seven additions into .grad (read both, write one: 12 bytes per
  // parameter), one optimizer step.
  const double micro = one.kiln_step().bytes - step_once;
  CHECK(eight.kiln_step().bytes == Approx(8 * micro + 7 * 12 * p + step_once).epsilon(1e-12));
  CHECK(eight.kiln_step().bytes / eight.tokens_per_step < one.kiln_step().bytes / one.tokens_per_step);
}

namespace {

// Llama-3.2-1B's head (V 128256, H 2048, tied) over one 8192-token micro-batch on a GPU in bf16,
// with the kernel choices the trainer takes there: the loss head's chunk rule is the op's own
// (train::kernel_choices hands ops::auto_chunk_tokens to the models).
RunDescription one_b_8192() {
  RunDescription o;
  o.batch = 1;
  o.cutoff_len = 8192;
  o.dtype = "bf16";
  o.cuda = true;
  o.kernels = kiln::train::kernel_choices("kiln", "bf16", /*cuda=*/true);
  o.kernels.attention = "flash";
  return o;
}

}  // namespace

TEST_CASE("traffic: the loss head's fp32 weight-gradient accumulator at 1B shapes, by hand", "[traffic][linear_ce]") {
  const auto config = kiln::model::load_llama_config("llama-3.2-1b");
  REQUIRE(config.vocab_size == 128256);
  REQUIRE(config.hidden_size == 2048);
  RunDescription o = one_b_8192();
  const TrafficReport r = kiln::cost::traffic_model(config, o);
  const auto& acc = r.loss_head_accumulator;
  // The op's rule at these shapes: 2048 rows per chunk (H, above the 1024-row floor), 4 chunks.
  CHECK(acc.chunk_tokens == kiln::ops::auto_chunk_tokens(8192, 128256, 2048));
  CHECK(acc.chunk_tokens == 2048);
  CHECK(acc.chunks == 4);
  // V H = 128256 x 2048 = 262,668,288; the fp32 [V, H] sum is 1,050,673,152 bytes, read and
  // written by each chunk's addmm: 2,101,346,304 bytes per chunk.
  CHECK(acc.bytes_per_chunk == 2101346304.0);
  // bf16 operands into the fp32 sum (addmm's out_dtype): the zero fill, then 4 chunks:
  // 1,050,673,152 + 4 x 2,101,346,304 = 9,456,058,368 bytes (1.97 ms at an H200's 4.8 TB/s).
  CHECK(acc.bytes == 9456058368.0);
  // Liger's 256-row chunks (the rule before): 1,050,673,152 + 32 x 2,101,346,304 = 68,293,754,880.
  CHECK(kiln::cost::loss_head_accumulator(8192, 128256, 2048, 256, true).bytes == 68293754880.0);
  // fp32 matmuls write the first chunk's product without reading: 1,050,673,152 + 3 x 2,101,346,304.
  CHECK(kiln::cost::loss_head_accumulator(8192, 128256, 2048, 2048, false).bytes == 7354712064.0);
  // A partial last chunk still reads and writes the whole sum: 8193 tokens are 5 chunks.
  CHECK(kiln::cost::loss_head_accumulator(8193, 128256, 2048, 2048, true).chunks == 5);

  // The head's backward row holds it: with 256-row chunks it moves 28 chunks more, each 8 V H
  // bytes of accumulator and 2 V H of the bf16 weight that the chunk's dh = G W reads.
  RunDescription liger = o;
  liger.kernels.loss_chunk_tokens = [](int64_t, int64_t, int64_t) { return int64_t{256}; };
  const TrafficReport old_rule = kiln::cost::traffic_model(config, liger);
  CHECK(old_rule.loss_head_accumulator.chunks == 32);
  const double vh = 128256.0 * 2048.0;
  CHECK(old_rule.find("LM head + loss", Pass::kBackward)->kiln.bytes -
            r.find("LM head + loss", Pass::kBackward)->kiln.bytes ==
        Approx(28 * (8 + 2) * vh).epsilon(1e-12));
  // Without the fused head there is no accumulator.
  RunDescription aten = o;
  aten.kernels.fused_loss_head = false;
  CHECK(kiln::cost::traffic_model(config, aten).loss_head_accumulator.bytes == 0);
}

TEST_CASE("memory: the fused loss head at 1B shapes peaks under 15% of the full-logits head", "[traffic][linear_ce]") {
  const auto config = kiln::model::load_llama_config("llama-3.2-1b");
  RunDescription o = one_b_8192();
  const auto fused = kiln::cost::estimate_training_memory(config, o);
  RunDescription aten = o;
  aten.kernels.fused_loss_head = false;
  const auto full = kiln::cost::estimate_training_memory(config, aten);
  REQUIRE(fused.peak_phase == "forward/backward boundary");
  REQUIRE(full.peak_phase == "forward/backward boundary");
  // ATen's head per token: the final norm's (8 + 2) H and 16 bytes per logit (bf16 logits, their
  // fp32 upcast, log-softmax, the gradients): 8192 x (10 x 2048 + 16 x 128256) = 16,978,542,592.
  CHECK(full.component("logits and loss") == 16978542592.0);
  // kiln's: (8 + 2 x 2) H per token (the norm, hidden and grad_hidden in bf16), the fp32 sum and
  // the bf16 weight (6 V H), one 2048-row chunk of bf16 logits that the kernel overwrites with
  // their gradient: 201,326,592 + 1,576,009,728 + 525,336,576 = 2,302,672,896.
  CHECK(fused.component("logits and loss") == 2302672896.0);
  CHECK(fused.component("logits and loss") <= 0.15 * full.component("logits and loss"));  // 13.6%
  // The next power of two, 4096 rows, would not be: 2,828,009,472 = 16.7%.
  CHECK(2302672896.0 + 2048.0 * 128256 * 2 > 0.15 * 16978542592.0);
}

TEST_CASE("traffic: modelled utilisation of a measured step", "[traffic]") {
  const auto config = kiln::model::load_llama_config("llama-100m");
  RunDescription o;
  o.batch = 8;
  o.cutoff_len = 1024;
  o.kernels = kiln::train::kernel_choices("kiln", "bf16", /*cuda=*/true);
  o.kernels.attention = "flash";
  const TrafficReport r = kiln::cost::traffic_model(config, o);
  const kiln::cost::Roofline roof = kiln::cost::roofline(*kiln::cost::hardware_spec("A100-80GB"), "bf16");
  const auto u = kiln::cost::modelled_utilisation(r, roof, 0.5);
  const auto step = r.kiln_step();
  CHECK(u.memory_bandwidth == Approx(step.bytes / 0.5 / 2039e9));
  CHECK(u.tensor_core == Approx(step.gemm_flops / 312e12 / 0.5));
  CHECK(u.fp_engine == Approx(step.other_flops / 19.5e12 / 0.5));
  // At the modelled time itself no counter can pass 100%, and the eager step moves more bytes.
  const double t = kiln::cost::modelled_step_seconds(r, roof);
  const auto at_model = kiln::cost::modelled_utilisation(r, roof, t);
  CHECK(at_model.memory_bandwidth <= 1.0);
  CHECK(at_model.tensor_core + at_model.fp_engine <= 1.0);
  CHECK(r.eager_step().bytes > step.bytes);
  // V100 has no bf16 tensor cores: its GEMMs count on the FP32 units.
  const kiln::cost::Roofline v100 = kiln::cost::roofline(*kiln::cost::hardware_spec("V100-32GB"), "bf16");
  CHECK_FALSE(v100.tensor_cores);
  const auto uv = kiln::cost::modelled_utilisation(r, v100, 1.0);
  CHECK(uv.tensor_core == 0);
  CHECK(uv.fp_engine == Approx(step.flops() / 15.7e12));
  CHECK(kiln::cost::kiln_attention_path(true, *kiln::cost::hardware_spec("V100-32GB"), "bf16", 64) == "sdpa");
  CHECK(kiln::cost::kiln_attention_path(true, *kiln::cost::hardware_spec("V100-32GB"), "fp16", 64) == "flash");
  CHECK(kiln::cost::kiln_attention_path(true, *kiln::cost::hardware_spec("A100-80GB"), "bf16", 128) == "flash");
  CHECK(kiln::cost::kiln_attention_path(false, *kiln::cost::hardware_spec("A100-80GB"), "bf16", 64) == "sdpa");
}

namespace {

// configs/reference/llama3-100m.yaml's model (the reference runs' "100M"), spelled out so the
// figures below do not move with that file: V 128256 (tied), H 512, F 2048, 9 layers, 8 heads of
// 64, 2 KV heads.
kiln::model::LlamaConfig llama3_100m() {
  kiln::model::LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 512;
  c.intermediate_size = 2048;
  c.num_hidden_layers = 9;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 8192;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = true;
  c.source = "test";
  return c;
}

// One 8 x 1024 micro-batch in bf16 on a GPU with kiln's choices there (the fused loss head), or
// with linear_ce=aten (the full-logits head, built from the same GEMMs as the eager column's).
RunDescription llama3_100m_run(bool fused_loss_head = true) {
  RunDescription o;
  o.batch = 8;
  o.cutoff_len = 1024;
  o.dtype = "bf16";
  o.cuda = true;
  o.kernels = kiln::train::kernel_choices("kiln", "bf16", /*cuda=*/true);
  o.kernels.attention = "flash";
  o.kernels.fused_loss_head = fused_loss_head;
  return o;
}

double eager_bytes(const TrafficReport& r, const std::string& component, Pass pass) {
  const auto* row = r.find(component, pass);
  REQUIRE(row != nullptr);
  return row->eager_step().bytes;
}

}  // namespace

TEST_CASE("traffic: GemmDram's default keeps the compulsory bytes", "[traffic][gemm_dram]") {
  using kiln::cost::GemmDram;
  CHECK(kiln::cost::gemm_reread_bytes(8192, 512, 128256, 2, GemmDram{}) == 0);
  const std::pair<kiln::model::LlamaConfig, RunDescription> cases[] = {
      {small_config(), small_options()}, {llama3_100m(), llama3_100m_run()}, {llama3_100m(), llama3_100m_run(false)}};
  for (const auto& [config, run] : cases) {
    const TrafficReport three = kiln::cost::traffic_model(config, run);
    const TrafficReport dflt = kiln::cost::traffic_model(config, run, {}, GemmDram{});
    // No L2 given: other tiles change nothing either.
    const TrafficReport tiles =
        kiln::cost::traffic_model(config, run, {}, GemmDram{.l2_bytes = 0, .tile_m = 64, .tile_n = 256});
    REQUIRE(dflt.rows.size() == three.rows.size());
    REQUIRE(tiles.rows.size() == three.rows.size());
    for (size_t i = 0; i < three.rows.size(); ++i) {
      CHECK(dflt.rows[i].kiln.bytes == three.rows[i].kiln.bytes);
      CHECK(dflt.rows[i].eager.bytes == three.rows[i].eager.bytes);
      CHECK(tiles.rows[i].kiln.bytes == three.rows[i].kiln.bytes);
      CHECK(tiles.rows[i].eager.bytes == three.rows[i].eager.bytes);
    }
    CHECK(dflt.kiln_step().bytes == three.kiln_step().bytes);
    CHECK(dflt.eager_step().bytes == three.eager_step().bytes);
  }
  // The hand-derived compulsory q_proj of the first test stays as it was.
  const TrafficReport r = kiln::cost::traffic_model(small_config(), small_options(), {}, GemmDram{});
  CHECK(r.find("q_proj", Pass::kForward)->kiln.bytes == 32768 + 8192 + 32768);
  CHECK_THROWS_AS(kiln::cost::gemm_reread_bytes(1, 1, 1, 2, GemmDram{.l2_bytes = -1}), std::invalid_argument);
  CHECK_THROWS_AS(kiln::cost::gemm_reread_bytes(1, 1, 1, 2, GemmDram{.l2_bytes = 1, .tile_m = 0}),
                  std::invalid_argument);
}

TEST_CASE("traffic: the LM head's GEMM re-reads past a V100's and an A100's L2, by hand", "[traffic][gemm_dram]") {
  using kiln::cost::GemmDram;
  const auto config = llama3_100m();
  const RunDescription run = llama3_100m_run();
  CHECK(config.num_parameters() == 99886592);  // the YAML's count
  const TrafficReport base = kiln::cost::traffic_model(config, run);
  const double v100_l2 = kiln::cost::hardware_spec("V100-32GB")->l2_bytes;  // 6 MiB
  const double a100_l2 = kiln::cost::hardware_spec("A100-80GB")->l2_bytes;  // 40 MiB
  const TrafficReport v100 = kiln::cost::traffic_model(config, run, {}, GemmDram{.l2_bytes = v100_l2});
  const TrafficReport a100 = kiln::cost::traffic_model(config, run, {}, GemmDram{.l2_bytes = a100_l2});

  // The eager head's forward, logits = x W^T in bf16 with N = 8 x 1024 = 8192 rows:
  //   A = x [8192, 512]       2 * 8192 * 512   =     8,388,608 bytes (8 MiB)
  //   B = W^T [512, 128256]   2 * 512 * 128256 =   131,334,144 bytes
  //   tiles 128 x 128: ceil(8192 / 128) = 64 rows, ceil(128256 / 128) = 1002 columns.
  // V100, L2 6 MiB: the smaller operand (8 MiB) exceeds half of it (3,145,728), so
  //   re-read A per further column: 8,388,608 * 1001 = 8,396,996,608
  //   re-read B per further row:   131,334,144 * 63 = 8,274,051,072   <- the cheaper
  const double head = eager_bytes(base, "LM head + loss", Pass::kForward);
  CHECK(eager_bytes(v100, "LM head + loss", Pass::kForward) - head == 8274051072.0);
  // A100, L2 40 MiB: 8 MiB fits in half of it (20,971,520): nothing re-read.
  CHECK(eager_bytes(a100, "LM head + loss", Pass::kForward) == head);
  // Backward, dY [8192, 128256] bf16 = 2,101,346,304 bytes:
  //   dX = dY W:   A = dY [8192, 128256], B = W [128256, 512] (131,334,144), 64 x 4 tiles:
  //                min(2,101,346,304 * 3, 131,334,144 * 63) = 6,304,038,912 (both L2s: 131 MB > 20 MiB)
  //   dW = dY^T X: A = dY^T [128256, 8192], B = X [8192, 512] (8 MiB), 1002 x 4 tiles:
  //                V100 min(2,101,346,304 * 3, 8,388,608 * 1001) = 6,304,038,912; A100: X fits, 0
  const double head_bwd = eager_bytes(base, "LM head + loss", Pass::kBackward);
  CHECK(eager_bytes(v100, "LM head + loss", Pass::kBackward) - head_bwd == 2 * 6304038912.0);
  CHECK(eager_bytes(a100, "LM head + loss", Pass::kBackward) - head_bwd == 6304038912.0);
  // The same head under kiln's linear_ce=aten; kiln's fused chunked head keeps its bytes.
  const TrafficReport aten =
      kiln::cost::traffic_model(config, llama3_100m_run(false), {}, GemmDram{.l2_bytes = v100_l2});
  CHECK(aten.find("LM head + loss", Pass::kForward)->kiln.bytes ==
        kiln::cost::traffic_model(config, llama3_100m_run(false)).find("LM head + loss", Pass::kForward)->kiln.bytes +
            8274051072.0);
  CHECK(v100.kiln_step("LM head + loss", Pass::kForward).bytes ==
        base.kiln_step("LM head + loss", Pass::kForward).bytes);
  CHECK(v100.kiln_step("LM head + loss", Pass::kBackward).bytes ==
        base.kiln_step("LM head + loss", Pass::kBackward).bytes);
  CHECK(v100.kiln_step("attention core", Pass::kForward).bytes ==
        base.kiln_step("attention core", Pass::kForward).bytes);

  // A layer's projections on the V100: every forward and dX operand pair has one under 3 MiB (the
  // weights are at most 2 MiB); the dW GEMMs' dY^T [n_out, 8192] and X [8192, k] do not:
  //   q_proj, o_proj: 8 MiB and 8 MiB, 4 x 4 tiles: 8,388,608 * 3                 =  25,165,824
  //   gate, up:       dY^T [2048, 8192] 32 MiB, X [8192, 512] 8 MiB, 16 x 4 tiles:
  //                   min(33,554,432 * 3, 8,388,608 * 15)                           = 100,663,296
  //   down:           dY^T [512, 8192] 8 MiB, X [8192, 2048] 32 MiB, 4 x 16 tiles:
  //                   min(8,388,608 * 15, 33,554,432 * 3)                           = 100,663,296
  //   k, v:           dY^T [128, 8192] 2 MiB fits                                    = 0
  // Per layer 352,321,536, x 9 layers; on the A100 every smaller operand fits in 20 MiB.
  const double layers_v100 = 9 * (2 * 25165824.0 + 3 * 100663296.0);
  CHECK(v100.kiln_step().bytes - base.kiln_step().bytes == layers_v100);
  CHECK(v100.eager_step().bytes - base.eager_step().bytes == layers_v100 + 8274051072.0 + 2 * 6304038912.0);
  CHECK(a100.kiln_step().bytes == base.kiln_step().bytes);
  CHECK(a100.eager_step().bytes - base.eager_step().bytes == 6304038912.0);
}

TEST_CASE("traffic: with a 40 MB L2 the LM head's forward re-reads nothing, with 6 MB it does",
          "[traffic][gemm_dram]") {
  using kiln::cost::GemmDram;
  const auto config = llama3_100m();
  const RunDescription run = llama3_100m_run(false);
  const TrafficReport base = kiln::cost::traffic_model(config, run);
  const auto head = [&](double l2) {
    const TrafficReport r = kiln::cost::traffic_model(config, run, {}, GemmDram{.l2_bytes = l2});
    return r.find("LM head + loss", Pass::kForward)->kiln.bytes;
  };
  const double compulsory = base.find("LM head + loss", Pass::kForward)->kiln.bytes;
  CHECK(head(40.0 * 1024 * 1024) == compulsory);  // the 8 MiB hidden states fit in 20 MiB
  CHECK(head(6.0 * 1024 * 1024) > compulsory);
  // The threshold: resident when 8 MiB <= L2 / 2.
  CHECK(head(16.0 * 1024 * 1024) == compulsory);
  CHECK(head(16.0 * 1024 * 1024 - 1) > compulsory);
}

TEST_CASE("traffic: a smaller L2 never gives fewer bytes", "[traffic][gemm_dram]") {
  using kiln::cost::GemmDram;
  const double mib = 1024.0 * 1024.0;
  // From one that holds every operand (the compulsory figures) down to one byte.
  const double l2s[] = {1e15, 50 * mib, 40 * mib, 16 * mib, 6 * mib, 2 * mib, 1 * mib, 64 * 1024.0, 1};
  const std::pair<kiln::model::LlamaConfig, RunDescription> cases[] = {
      {small_config(), small_options()}, {llama3_100m(), llama3_100m_run()}, {llama3_100m(), llama3_100m_run(false)}};
  for (auto [config, run] : cases) {
    for (const std::string recompute : {"none", "full"}) {
      run.recompute = recompute;
      const TrafficReport base = kiln::cost::traffic_model(config, run);
      TrafficReport previous = kiln::cost::traffic_model(config, run, {}, GemmDram{.l2_bytes = l2s[0]});
      REQUIRE(previous.rows.size() == base.rows.size());
      for (size_t i = 0; i < base.rows.size(); ++i) {
        CHECK(previous.rows[i].kiln.bytes == base.rows[i].kiln.bytes);
        CHECK(previous.rows[i].eager.bytes == base.rows[i].eager.bytes);
      }
      for (const double l2 : l2s) {
        const TrafficReport r = kiln::cost::traffic_model(config, run, {}, GemmDram{.l2_bytes = l2});
        REQUIRE(r.rows.size() == previous.rows.size());
        for (size_t i = 0; i < r.rows.size(); ++i) {
          CHECK(r.rows[i].kiln.bytes >= previous.rows[i].kiln.bytes);
          CHECK(r.rows[i].eager.bytes >= previous.rows[i].eager.bytes);
          CHECK(r.rows[i].kiln.gemm_flops == base.rows[i].kiln.gemm_flops);  // bytes only
        }
        CHECK(r.kiln_step().bytes >= previous.kiln_step().bytes);
        CHECK(r.eager_step().bytes >= previous.eager_step().bytes);
        previous = r;
      }
      // At one byte every GEMM with more than one tile row and column re-reads.
      CHECK(previous.eager_step().bytes > base.eager_step().bytes);
    }
  }
}

TEST_CASE("traffic: GEMM re-reads past the L2 per step, llama3-100m 8 x 1024 bf16 (printed)", "[.][gemm_dram_print]") {
  using kiln::cost::GemmDram;
  const auto config = llama3_100m();
  for (const bool fused : {true, false}) {
    const TrafficReport base = kiln::cost::traffic_model(config, llama3_100m_run(fused));
    for (const char* device : {"V100-32GB", "A100-80GB"}) {
      const double l2 = kiln::cost::hardware_spec(device)->l2_bytes;
      const TrafficReport r = kiln::cost::traffic_model(config, llama3_100m_run(fused), {}, GemmDram{.l2_bytes = l2});
      WARN(device << (fused ? " (fused loss head)" : " (linear_ce=aten)") << ": kiln " << base.kiln_step().bytes
                  << " + " << r.kiln_step().bytes - base.kiln_step().bytes << ", eager " << base.eager_step().bytes
                  << " + " << r.eager_step().bytes - base.eager_step().bytes);
    }
  }
}

TEST_CASE("traffic: a wave of SMs shares its tiles' slices through the L2 (GemmDram::sms)", "[traffic][gemm_dram]") {
  using kiln::cost::GemmDram;
  // llama3-100m's LM head forward at 8 x 1024 tokens in fp16: A = hidden [8192, 512] (8 MiB),
  // B = W^T [512, 128256] (131,334,144 bytes). A V100's 80 SMs run blocks of 9 x 9 tiles of
  // 128 x 128: ceil(128256 / 1152) = 112 block columns, ceil(8192 / 1152) = 8 block rows.
  const double a = 2.0 * 8192 * 512, b = 2.0 * 512 * 128256;
  const GemmDram v100{6.0 * 1024 * 1024, 128, 128, 80};
  CHECK(kiln::cost::gemm_reread_bytes(8192, 512, 128256, 2, v100) == std::min(a * 111, b * 7));
  // One tile at a time (sms 0) re-reads the operand per tile row or column.
  const GemmDram single{6.0 * 1024 * 1024};
  CHECK(kiln::cost::gemm_reread_bytes(8192, 512, 128256, 2, single) == std::min(a * 1001, b * 63));
  // More SMs in a wave never re-read more.
  double previous = kiln::cost::gemm_reread_bytes(8192, 512, 128256, 2, single);
  for (double sms : {4.0, 16.0, 80.0, 108.0, 132.0, 1024.0}) {
    const double r = kiln::cost::gemm_reread_bytes(8192, 512, 128256, 2, GemmDram{6.0 * 1024 * 1024, 128, 128, sms});
    CHECK(r <= previous);
    previous = r;
  }
  CHECK_THROWS_AS(kiln::cost::gemm_reread_bytes(1, 1, 1, 2, GemmDram{1, 128, 128, -1}), std::invalid_argument);
}

TEST_CASE("traffic: log_softmax's repeated passes over rows an SM's worth of which exceed the L2",
          "[traffic][gemm_dram]") {
  using kiln::cost::GemmDram;
  // ATen's log_softmax over rows too long for shared memory reads each row three times forward and
  // the incoming gradient twice backward (SoftMax.cu); with one row in flight per SM and those rows
  // past the L2, the repeats are DRAM traffic: 8 bytes per logit forward, 4 backward.
  const auto config = llama3_100m();  // 128,256 fp32 logits per row: 513 KB
  const RunDescription run = llama3_100m_run(false);
  const double n = 8.0 * 1024, v = 128256, h = 512, c = 2;
  const TrafficReport plain = kiln::cost::traffic_model(config, run);
  for (const char* device : {"V100-32GB", "A100-80GB", "H100-80GB"}) {
    const auto hw = *kiln::cost::hardware_spec(device);
    const GemmDram dram{hw.l2_bytes, 128, 128, hw.sms};
    INFO(device);
    REQUIRE(hw.sms * 4 * v > hw.l2_bytes);  // 80-132 rows of 513 KB: 41-68 MB, past 6-50 MB
    const TrafficReport r = kiln::cost::traffic_model(config, run, {}, dram);
    const auto* fwd = r.find("LM head + loss", Pass::kForward);
    const auto* bwd = r.find("LM head + loss", Pass::kBackward);
    CHECK(fwd->eager.bytes == Approx(plain.find("LM head + loss", Pass::kForward)->eager.bytes +
                                     kiln::cost::gemm_reread_bytes(n, h, v, c, dram) + 8 * n * v));
    CHECK(bwd->eager.bytes == Approx(plain.find("LM head + loss", Pass::kBackward)->eager.bytes +
                                     kiln::cost::gemm_reread_bytes(n, v, h, c, dram) +
                                     kiln::cost::gemm_reread_bytes(v, n, h, c, dram) + 4 * n * v));
  }
  // llama-100m's 32,000 logits (128 KB a row): past a V100's 6 MB with 80 SMs, within an A100's 40.
  kiln::model::LlamaConfig small = llama3_100m();
  small.vocab_size = 32000;
  const TrafficReport small_plain = kiln::cost::traffic_model(small, run);
  const auto a100 = *kiln::cost::hardware_spec("A100-80GB");
  const TrafficReport small_a100 =
      kiln::cost::traffic_model(small, run, {}, GemmDram{a100.l2_bytes, 128, 128, a100.sms});
  CHECK(small_a100.find("LM head + loss", Pass::kForward)->eager.bytes ==
        Approx(small_plain.find("LM head + loss", Pass::kForward)->eager.bytes +
               kiln::cost::gemm_reread_bytes(n, h, 32000, c, GemmDram{a100.l2_bytes, 128, 128, a100.sms})));
  // Without SMs (the one-tile rule) the row term stays off.
  const TrafficReport no_sms = kiln::cost::traffic_model(config, run, {}, GemmDram{6.0 * 1024 * 1024});
  CHECK(no_sms.find("LM head + loss", Pass::kForward)->eager.bytes ==
        Approx(plain.find("LM head + loss", Pass::kForward)->eager.bytes +
               kiln::cost::gemm_reread_bytes(n, h, v, c, GemmDram{6.0 * 1024 * 1024})));
}
