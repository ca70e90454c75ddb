// kiln-profile explain's report: the traffic and FLOP model of one step, per component
// (cost/traffic.h), in Markdown or JSON.
#include <cmath>

#include "kiln/profile/report_internal.h"

namespace kiln::profile {

using namespace report_detail;

namespace {

// Rows summed: the step (per step, or per token with div the tokens) or one pass. Six
// significant digits (the Python test sums rows against them), whole numbers from a million.
struct Sum {
  std::string label;
  double div = 1;
  cost::Cost kiln{}, eager{};
  double kiln_seconds = 0, eager_seconds = 0, model_flops = 0;
};
std::vector<Column<Sum>> sum_columns(const char* first, bool model) {
  auto col = [](const char* name, const char* key, char prefix, double (*get)(const Sum&)) -> Column<Sum> {
    return {name,
            [=](const Sum& s) {
              const double v = in_unit(get(s), prefix) / s.div;
              return std::abs(v) >= 1e6 ? fmt::format("{:.0f}", v) : fmt::format("{:.6g}", v);
            },
            key, [=](const Sum& s) { return json(get(s)); }, true};
  };
  std::vector<Column<Sum>> out = {
      {first, [](const Sum& s) { return s.label; }},
      col("GEMM GFLOP", "gemm_flops", 'G', [](const Sum& s) { return s.kiln.gemm_flops; }),
      col("other GFLOP", "other_flops", 'G', [](const Sum& s) { return s.kiln.other_flops; }),
      col("model GFLOP (flops.h)", "model_flops", 'G', [](const Sum& s) { return s.model_flops; }),
      col("MB kiln", "bytes", 'M', [](const Sum& s) { return s.kiln.bytes; }),
      col("MB eager", "eager_bytes", 'M', [](const Sum& s) { return s.eager.bytes; }),
      col("ms kiln", "modelled_seconds", 'm', [](const Sum& s) { return s.kiln_seconds; }),
      col("ms eager", "eager_modelled_seconds", 'm', [](const Sum& s) { return s.eager_seconds; })};
  if (!model) out.erase(out.begin() + 3);
  return out;
}
Sum step_sum(const ExplainReport& e) {
  const cost::TrafficReport& r = e.traffic;
  return {fmt::format("per step ({} tokens)", r.tokens_per_step),
          1,
          r.kiln_step(),
          r.eager_step(),
          cost::modelled_step_seconds(r, e.roof),
          cost::modelled_step_seconds(r, e.roof, true),
          r.model_flops_step()};
}

// The three counters the model expects at a measured step time, of kiln's step and an eager one.
using Variant = std::pair<std::string, cost::ModelledUtilisation>;
std::vector<Column<Variant>> variant_columns() {
  using V = const Variant&;
  return {{"variant", [](V v) { return v.first; }},
          number<Variant>("memory bandwidth", "memory_bandwidth", '%', "{:.1f}%",
                          [](V v) { return v.second.memory_bandwidth; }),
          number<Variant>("tensor core", "tensor_core", '%', "{:.1f}%", [](V v) { return v.second.tensor_core; }),
          number<Variant>("fp engine", "fp_engine", '%', "{:.1f}%", [](V v) { return v.second.fp_engine; })};
}
std::vector<Variant> variants(const ExplainReport& e) {
  return {{"kiln", cost::modelled_utilisation(e.traffic, e.roof, e.step_seconds)},
          {"eager", cost::modelled_utilisation(e.traffic, e.roof, e.step_seconds, true)}};
}

}  // namespace

std::string explain_markdown(const ExplainReport& e) {
  const cost::TrafficReport& r = e.traffic;
  const cost::RunDescription& o = r.run;
  const cost::Roofline& roof = e.roof;
  const bool autocast = o.dtype != "fp32";
  const char* aten = "ATen composition";
  std::string out = fmt::format(
      "# kiln explain: {} ({} parameters), {}{}, micro-batch {} x cutoff_len {}, gradient_accumulation_steps {} "
      "({} tokens per step{}), recomputation {}, kernels {}, {}\n\n",
      e.model_name, r.num_parameters, o.dtype, autocast ? " autocast over fp32 parameters" : "", o.batch, o.cutoff_len,
      o.gradient_accumulation_steps, static_cast<int64_t>(r.tokens_per_step),
      o.parallel.world_size > 1
          ? fmt::format(" per rank, {} ranks, ZeRO stage {}", o.parallel.world_size, o.parallel.zero_stage)
          : "",
      o.recompute == "every_n" ? fmt::format("every_{}", o.every) : o.recompute, e.kernels, e.device);
  out += fmt::format("Ops: RMSNorm {}, SwiGLU {}, RoPE {}, attention {}, loss head {}.\n",
                     o.kernels.fused_rmsnorm ? "kiln kernel" : aten, o.kernels.fused_swiglu ? "kiln kernel" : aten,
                     o.kernels.fused_rope && !autocast ? "kiln kernel (in place)"
                     : o.kernels.fused_rope && o.kernels.mixed_rope_fused
                         ? "kiln mixed-dtype kernel (bf16/fp16 q, k into fp32)"
                     : autocast ? "ATen composition (bf16/fp16 q, k with fp32 tables: ops/rope.cpp)"
                                : aten,
                     o.kernels.attention == "flash" ? "kiln flash kernels" : "ATen SDPA (" + o.kernels.attention + ")",
                     o.kernels.fused_loss_head ? "kiln chunked linear + cross-entropy" : "full logits (ATen)");
  out += fmt::format(
      "Roofline: GEMMs {:.1f} TFLOP/s ({}), other ops {:.1f} TFLOP/s (FP32 units), {:.0f} GB/s; "
      "ridge point {:.1f} FLOP/byte for a GEMM, {:.1f} for the FP32 units.\n"
      "Bytes are compulsory device-memory traffic (each tensor an op reads or writes counted once; L2 re-reads "
      "not), per step; `eager` is an unfused HF-transformers eager step (cost/traffic.h).\n\n",
      roof.gemm_flops_per_s / 1e12, roof.tensor_cores ? "tensor cores" : "FP32 units", roof.other_flops_per_s / 1e12,
      roof.bandwidth / 1e9, roof.ridge(), roof.other_flops_per_s / roof.bandwidth);
  out += markdown_table(component_columns(false), component_rows(r, roof), true);
  if (r.loss_head_accumulator.chunks > 0) {
    // The fused head's term the chunk rule sets, part of its backward row above.
    const cost::LossHeadAccumulator& acc = r.loss_head_accumulator;
    const double step_bytes = acc.bytes * static_cast<double>(o.gradient_accumulation_steps);
    const double head = r.kiln_step("LM head + loss", cost::Pass::kForward).bytes +
                        r.kiln_step("LM head + loss", cost::Pass::kBackward).bytes;
    out += fmt::format(
        "\nLoss head accumulator: {} chunks of {} tokens per micro-batch, each reading and writing the fp32 [V, H] "
        "weight-gradient sum ({:.2f} MB per chunk): {:.2f} MB per step with its first write, {:.1f}% of the head's "
        "bytes, {:.1f} us at {:.0f} GB/s.\n",
        acc.chunks, acc.chunk_tokens, acc.bytes_per_chunk / 1e6, step_bytes / 1e6,
        head > 0 ? 100.0 * step_bytes / head : 0.0, step_bytes / roof.bandwidth * 1e6, roof.bandwidth / 1e9);
  }
  const Sum step = step_sum(e);
  Sum token = step;
  token.label = "per token", token.div = r.tokens_per_step;
  out += "\n" + markdown_table(sum_columns("total", true), std::vector<Sum>{step, token}, true);
  // The same per pass: how much of the step is forward, backward, recomputation, optimizer.
  std::vector<Sum> passes;
  double memory_bound = 0;
  for (const cost::Pass pass :
       {cost::Pass::kForward, cost::Pass::kBackward, cost::Pass::kRecompute, cost::Pass::kStep}) {
    Sum s{cost::pass_name(pass)};
    for (const cost::TrafficRow& row : r.rows) {
      if (row.pass != pass) continue;
      s.kiln += row.kiln_step(), s.eager += row.eager_step();
      s.kiln_seconds += roof.seconds(row.kiln) * row.repeats, s.eager_seconds += roof.seconds(row.eager) * row.repeats;
    }
    if (s.kiln.bytes != 0 || s.eager.bytes != 0) passes.push_back(s);
  }
  for (const cost::TrafficRow& row : r.rows) {
    if (roof.memory_bound(row.kiln)) memory_bound += roof.seconds(row.kiln) * row.repeats;
  }
  out += "\n" + markdown_table(sum_columns("pass", false), passes, true);
  const double tk = step.kiln_seconds;
  out += fmt::format(
      "\nModelled step: kiln {:.2f} ms ({:.0f} tokens/s), {:.0f}% of it in memory-bound rows; eager {:.2f} ms. "
      "At the modelled time kiln's step moves {:.0f} GB/s ({:.0f}% of {:.0f} GB/s).\n",
      tk * 1e3, r.tokens_per_step / tk, 100.0 * memory_bound / tk, step.eager_seconds * 1e3, step.kiln.bytes / tk / 1e9,
      100.0 * step.kiln.bytes / tk / roof.bandwidth, roof.bandwidth / 1e9);
  if (e.step_seconds > 0) {
    out += fmt::format("\nAt a measured {:.4g} s per step ({:.0f} tokens/s), modelled counters:\n\n", e.step_seconds,
                       r.tokens_per_step / e.step_seconds);
    out += markdown_table(variant_columns(), variants(e), true);
  }
  return out;
}

std::string explain_json(const ExplainReport& e) {
  const cost::TrafficReport& t = e.traffic;
  const cost::RunDescription& o = t.run;
  const cost::LossHeadAccumulator& acc = t.loss_head_accumulator;
  json doc =
      object("model", e.model_name, "num_parameters", t.num_parameters, "cutoff_len", o.cutoff_len, "batch_size",
             o.batch, "gradient_accumulation_steps", o.gradient_accumulation_steps, "dtype", o.dtype, "attention",
             o.kernels.attention, "recompute", o.recompute, "tokens_per_step", t.tokens_per_step, "roofline",
             roofline_json(e.roof, e.bandwidth_source), "components",
             json_rows(component_columns(), component_rows(t, e.roof)),
             // The fused loss head's fp32 weight-gradient sum (its bytes are in the head's row).
             "loss_head_accumulator",
             object("chunk_tokens", acc.chunk_tokens, "chunks", acc.chunks, "bytes_per_chunk", acc.bytes_per_chunk,
                    "bytes_per_step", acc.bytes * static_cast<double>(o.gradient_accumulation_steps)),
             "totals", json_row(sum_columns("total", true), step_sum(e)));
  if (e.step_seconds > 0) {
    const auto v = variants(e);
    doc["modelled_counters"] = object("step_seconds", e.step_seconds, "kiln", json_row(variant_columns(), v[0]),
                                      "eager", json_row(variant_columns(), v[1]));
  }
  return doc.dump(2) + "\n";
}

}  // namespace kiln::profile
