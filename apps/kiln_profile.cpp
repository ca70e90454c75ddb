// kiln-profile: resource tables (speed, memory, MFU per cutoff_len, batch size and gradient
// accumulation), measured by running the trainer's step and set beside the analytic FLOP and
// memory models (sweep); the memory planner (plan); the modelled traffic and FLOPs of one step
// (explain). Each subcommand reads its keys through its own table (profile/command_keys.h).
// Markdown on stdout; CSV, JSON and HTML in output_dir.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "kiln/common/malloc_tuning.h"
#include "kiln/config/key_table.h"
#include "kiln/cost/plan.h"
#include "kiln/cost/traffic.h"
#include "kiln/dist/env.h"
#include "kiln/model/llama_config.h"
#include "kiln/profile/command_keys.h"
#include "kiln/profile/plan_report.h"
#include "kiln/profile/reference_report.h"
#include "kiln/profile/report.h"
#include "kiln/profile/sweep.h"

namespace {

using kiln::profile::Command;

const char* const kSpellingHelp =
    "Keys are snake_case, kiln-pretrain's and LLaMA-Factory's names where they exist; on the command line\n"
    "--KEY VALUE or --KEY=VALUE, a key in kebab case too (--cutoff-len), a boolean key alone for true\n"
    "(--counters). Aliases: --batch-size = per_device_train_batch_size, --grad-accum =\n"
    "gradient_accumulation_steps, --output = output_dir, --trace = trace_dir, --no-overlap = ddp_overlap false.\n"
    "A key given twice: the last wins. An unknown key, or another subcommand's, is an error.\n";

void print_help() {
  fmt::print(
      "Usage: kiln-profile COMMAND [--KEY VALUE ...]\n\n"
      "Commands:\n"
      "  sweep      measure training speed and memory over a grid of cutoff_len x batch size x gradient\n"
      "             accumulation, each point a short run of kiln-pretrain's step, beside the analytic FLOP\n"
      "             and memory models (docs/performance.md)\n"
      "  plan       the settings that fit a device's memory per cutoff_len, ranked by predicted speed, from\n"
      "             the analytic models (nothing is allocated)\n"
      "  explain    the modelled FLOPs and memory traffic of one step per component, kiln's and an eager HF\n"
      "             step's, against a device's roofline (nothing runs)\n"
      "  reference  the reference LLaMA-Factory runs (configs/reference/llamafactory_runs.yaml) predicted,\n"
      "             speed and nvidia-smi memory against their measured figures, beside kiln's own\n"
      "             prediction for the same work (nothing runs)\n\n"
      "kiln-profile COMMAND --help lists the command's keys.\n{}",
      kSpellingHelp);
}

void print_command_help(Command command) {
  switch (command) {
    case Command::kSweep:
      fmt::print(
          "Usage: kiln-profile sweep [--config FILE] [--KEY VALUE ...]\n\n"
          "Measures speed, memory and MFU at every point of cutoff_len x per_device_train_batch_size x\n"
          "gradient_accumulation_steps (each a list), each point a short run of kiln-pretrain's step with the\n"
          "config's schedule, beside the FLOP, memory and traffic models. Launched by torchrun or srun, the\n"
          "step is data-parallel (rank 0 reports). KILN_MALLOC_TUNING=1 raises glibc's malloc thresholds.\n\n");
      break;
    case Command::kPlan:
      fmt::print(
          "Usage: kiln-profile plan --model M --device_memory SIZE|NAME (--target_tokens N | --target_sequences N)"
          " [--KEY VALUE ...]\n\n"
          "The settings (micro-batch, accumulation, recomputation) that fit the device's memory at each\n"
          "cutoff_len, ranked by predicted speed, from the analytic models only (docs/performance.md).\n\n");
      break;
    case Command::kReference:
      fmt::print(
          "Usage: kiln-profile reference [--json] [--output_dir DIR] [--KEY VALUE ...]\n\n"
          "Every row of the reference runs' data file with its measured speed, nvidia-smi memory and counters, the\n"
          "reference stack's prediction (LLaMA-Factory 0.9 on transformers 4.45: SDPA attention, gradient\n"
          "checkpointing, fp32 logits, foreach AdamW; host and device time; the caching allocator's segments,\n"
          "replayed tensor by tensor, and the CUDA context) and the ratio, and kiln's own prediction for the same\n"
          "work on the same GPU (docs/performance.md, \"The reference runs, predicted\"). Nothing runs.\n\n");
      break;
    case Command::kExplain:
      fmt::print(
          "Usage: kiln-profile explain --model M --cutoff_len N --per_device_train_batch_size N [--KEY VALUE ...]\n\n"
          "The modelled FLOPs and memory traffic of one step per component (kiln's and an unfused eager HF\n"
          "step's) against the roofline of a device of the table (device_memory), this GPU, or this CPU\n"
          "(device cpu): nothing runs (cost/traffic.h).\n\n");
      break;
  }
  std::vector<kiln::config::KeyDoc> keys = kiln::profile::command_keys(command);
  if (command == Command::kSweep) {
    keys.insert(keys.begin(), {"config", "FILE",
                               "a configs/profile/*.yaml with these keys (the command line overrides it; given "
                               "twice, the last wins)"});
  }
  fmt::print("{}\n{}", kiln::config::keys_help(keys), kSpellingHelp);
}

// kiln-profile plan: the memory planner, from the analytic models only (nothing is allocated).
int plan(const kiln::profile::Overrides& overrides) {
  const auto settings = kiln::profile::read_plan_settings(overrides);
  const auto report = kiln::cost::make_plan(kiln::profile::plan_config(settings));
  fmt::print("{}", kiln::profile::plan_markdown(report));
  std::fflush(stdout);
  for (const auto& path : kiln::profile::write_plan_reports(report, settings.output_dir, settings.formats)) {
    fmt::print(stderr, "kiln-profile: wrote {}\n", path);
  }
  return 0;
}

// kiln-profile explain: the traffic and FLOP model of one step, per component (cost/traffic.h),
// from the model's config alone: no weights, no tensors, nothing run.
int explain(const kiln::profile::Overrides& overrides) {
  namespace cost = kiln::cost;
  // Six significant digits (the Python test sums rows against them), whole numbers from a million.
  auto num = [](double x) { return std::abs(x) >= 1e6 ? fmt::format("{:.0f}", x) : fmt::format("{:.6g}", x); };
  const auto settings = kiln::profile::read_explain_settings(overrides);
  const std::string& model_name = settings.model;
  const kiln::model::LlamaConfig model = kiln::model::load_llama_config(model_name);
  // The hardware row: a device of cost/hardware.h by name, this machine's GPU, or this CPU.
  const kiln::profile::ExplainDevice hw = kiln::profile::explain_device(settings);
  // The step as kiln-pretrain and the sweep describe theirs (train/run_description.h): the
  // recomputation rule, the kernels that run on that device, the data parallelism.
  const cost::RunDescription run = kiln::profile::explain_run(settings, model, hw);
  const cost::TrafficReport r = cost::traffic_model(model, run);
  cost::Roofline roof = cost::roofline(hw.hardware, run.dtype);
  if (settings.peak_tflops > 0) roof.gemm_flops_per_s = settings.peak_tflops * 1e12;
  if (settings.json) {
    std::string text = kiln::profile::explain_json(model_name, r, roof, hw.bandwidth_source);
    if (settings.step_seconds > 0) {  // the same modelled counters the Markdown prints
      const double s = settings.step_seconds;
      auto j = nlohmann::json::parse(text);
      auto counters = [](const cost::ModelledUtilisation& u) {
        return nlohmann::json{
            {"memory_bandwidth", u.memory_bandwidth}, {"tensor_core", u.tensor_core}, {"fp_engine", u.fp_engine}};
      };
      j["modelled_counters"] = {{"step_seconds", s},
                                {"kiln", counters(cost::modelled_utilisation(r, roof, s))},
                                {"eager", counters(cost::modelled_utilisation(r, roof, s, true))}};
      text = j.dump(2) + "\n";
    }
    fmt::print("{}", text);
    std::fflush(stdout);
    return 0;
  }

  const cost::RunDescription& o = run;
  const std::string policy = o.recompute == "every_n" ? fmt::format("every_{}", o.every) : o.recompute;
  fmt::print(
      "# kiln explain: {} ({} parameters), {}{}, micro-batch {} x cutoff_len {}, gradient_accumulation_steps {} "
      "({} tokens per step{}), recomputation {}, kernels {}, {}\n\n",
      model_name, r.num_parameters, o.dtype, o.dtype == "fp32" ? "" : " autocast over fp32 parameters", o.batch,
      o.seq_len, o.grad_accum, static_cast<int64_t>(r.tokens_per_step),
      o.parallel.world_size > 1
          ? fmt::format(" per rank, {} ranks, ZeRO stage {}", o.parallel.world_size, o.parallel.zero_stage)
          : "",
      policy, settings.kernels, hw.hardware.name);
  const bool autocast = o.dtype != "fp32";
  fmt::print("Ops: RMSNorm {}, SwiGLU {}, RoPE {}, attention {}, loss head {}.\n",
             o.kernels.fused_rmsnorm ? "kiln kernel" : "ATen composition",
             o.kernels.fused_swiglu ? "kiln kernel" : "ATen composition",
             o.kernels.fused_rope && !autocast ? "kiln kernel (in place)"
             : o.kernels.fused_rope && autocast && o.kernels.mixed_rope_fused
                 ? "kiln mixed-dtype kernel (bf16/fp16 q, k into fp32)"
             : autocast ? "ATen composition (bf16/fp16 q, k with fp32 tables: ops/rope.cpp)"
                        : "ATen composition",
             o.kernels.attention == "flash" ? "kiln flash kernels" : "ATen SDPA (" + o.kernels.attention + ")",
             o.kernels.fused_loss_head ? "kiln chunked linear + cross-entropy" : "full logits (ATen)");
  fmt::print(
      "Roofline: GEMMs {:.1f} TFLOP/s ({}), other ops {:.1f} TFLOP/s (FP32 units), {:.0f} GB/s; "
      "ridge point {:.1f} FLOP/byte for a GEMM, {:.1f} for the FP32 units.\n",
      roof.gemm_flops_per_s / 1e12, roof.tensor_cores ? "tensor cores" : "FP32 units", roof.other_flops_per_s / 1e12,
      roof.bandwidth / 1e9, roof.ridge(), roof.other_flops_per_s / roof.bandwidth);
  fmt::print(
      "Bytes are compulsory device-memory traffic (each tensor an op reads or writes counted once; L2 re-reads "
      "not), per step; `eager` is an unfused HF-transformers eager step (cost/traffic.h).\n\n");

  fmt::print(
      "| component | pass | x | GEMM GFLOP | other GFLOP | MB kiln | MB eager | FLOP/B kiln | bound kiln | "
      "us kiln | us eager |\n");
  fmt::print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n");
  for (const cost::TrafficRow& row : r.rows) {
    const cost::Cost k = row.kiln_step(), e = row.eager_step();
    const std::string bound = k.bytes == 0 && k.flops() == 0 ? "-" : roof.memory_bound(row.kiln) ? "memory" : "compute";
    fmt::print("| {} | {} | {:g} | {:.3f} | {:.3f} | {:.2f} | {:.2f} | {:.1f} | {} | {:.1f} | {:.1f} |\n",
               row.component, cost::pass_name(row.pass), row.repeats, k.gemm_flops / 1e9, k.other_flops / 1e9,
               k.bytes / 1e6, e.bytes / 1e6, row.kiln.intensity(), bound, roof.seconds(row.kiln) * row.repeats * 1e6,
               roof.seconds(row.eager) * row.repeats * 1e6);
  }
  if (r.loss_head_accumulator.chunks > 0) {
    // The fused head's term the chunk rule sets, part of its backward row above.
    const cost::LossHeadAccumulator& acc = r.loss_head_accumulator;
    const double step_bytes = acc.bytes * static_cast<double>(o.grad_accum);
    const double head = r.kiln_step("LM head + loss", cost::Pass::kForward).bytes +
                        r.kiln_step("LM head + loss", cost::Pass::kBackward).bytes;
    fmt::print(
        "\nLoss head accumulator: {} chunks of {} tokens per micro-batch, each reading and writing the fp32 [V, H] "
        "weight-gradient sum ({:.2f} MB per chunk): {:.2f} MB per step with its first write, {:.1f}% of the head's "
        "bytes, {:.1f} us at {:.0f} GB/s.\n",
        acc.chunks, acc.chunk_tokens, acc.bytes_per_chunk / 1e6, step_bytes / 1e6,
        head > 0 ? 100.0 * step_bytes / head : 0.0, step_bytes / roof.bandwidth * 1e6, roof.bandwidth / 1e9);
  }
  const cost::Cost k = r.kiln_step(), e = r.eager_step();
  const double tk = cost::modelled_step_seconds(r, roof), te = cost::modelled_step_seconds(r, roof, true);
  const double tokens = r.tokens_per_step;
  fmt::print(
      "\n| total | GEMM GFLOP | other GFLOP | model GFLOP (flops.h) | MB kiln | MB eager | ms kiln | ms eager |\n");
  fmt::print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const auto& [label, div] : {std::pair<std::string, double>{fmt::format("per step ({} tokens)", tokens), 1.0},
                                   std::pair<std::string, double>{"per token", tokens}}) {
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} |\n", label, num(k.gemm_flops / 1e9 / div),
               num(k.other_flops / 1e9 / div), num(r.model_flops_step() / 1e9 / div), num(k.bytes / 1e6 / div),
               num(e.bytes / 1e6 / div), num(tk * 1e3 / div), num(te * 1e3 / div));
  }
  // The same per pass: how much of the step is forward, backward, recomputation, optimizer.
  fmt::print("\n| pass | GEMM GFLOP | other GFLOP | MB kiln | MB eager | ms kiln | ms eager |\n");
  fmt::print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const cost::Pass pass :
       {cost::Pass::kForward, cost::Pass::kBackward, cost::Pass::kRecompute, cost::Pass::kStep}) {
    cost::Cost pk, pe;
    double sk = 0, se = 0;
    for (const cost::TrafficRow& row : r.rows) {
      if (row.pass != pass) continue;
      pk += row.kiln_step(), pe += row.eager_step();
      sk += roof.seconds(row.kiln) * row.repeats, se += roof.seconds(row.eager) * row.repeats;
    }
    if (pk.bytes == 0 && pe.bytes == 0) continue;
    fmt::print("| {} | {} | {} | {} | {} | {} | {} |\n", cost::pass_name(pass), num(pk.gemm_flops / 1e9),
               num(pk.other_flops / 1e9), num(pk.bytes / 1e6), num(pe.bytes / 1e6), num(sk * 1e3), num(se * 1e3));
  }
  double memory_bound = 0;
  for (const cost::TrafficRow& row : r.rows) {
    if (roof.memory_bound(row.kiln)) memory_bound += roof.seconds(row.kiln) * row.repeats;
  }
  fmt::print(
      "\nModelled step: kiln {:.2f} ms ({:.0f} tokens/s), {:.0f}% of it in memory-bound rows; eager {:.2f} ms. "
      "At the modelled time kiln's step moves {:.0f} GB/s ({:.0f}% of {:.0f} GB/s).\n",
      tk * 1e3, tokens / tk, 100.0 * memory_bound / tk, te * 1e3, k.bytes / tk / 1e9,
      100.0 * k.bytes / tk / roof.bandwidth, roof.bandwidth / 1e9);
  if (settings.step_seconds > 0) {
    // The three counters for a measured step time, as the model says they should read.
    const double s = settings.step_seconds;
    const auto uk = cost::modelled_utilisation(r, roof, s), ue = cost::modelled_utilisation(r, roof, s, true);
    fmt::print("\nAt a measured {:.4g} s per step ({:.0f} tokens/s), modelled counters:\n\n", s, tokens / s);
    fmt::print("| variant | memory bandwidth | tensor core | fp engine |\n| --- | ---: | ---: | ---: |\n");
    fmt::print("| kiln | {:.1f}% | {:.1f}% | {:.1f}% |\n", 100 * uk.memory_bandwidth, 100 * uk.tensor_core,
               100 * uk.fp_engine);
    fmt::print("| eager | {:.1f}% | {:.1f}% | {:.1f}% |\n", 100 * ue.memory_bandwidth, 100 * ue.tensor_core,
               100 * ue.fp_engine);
  }
  std::fflush(stdout);
  return 0;
}

// kiln-profile sweep: the measured grid.
int sweep(const std::string& config_path, const kiln::profile::Overrides& overrides) {
  const bool model_given =
      std::any_of(overrides.begin(), overrides.end(), [](const auto& kv) { return kv.first == "model"; });
  if (config_path.empty() && !model_given) throw std::invalid_argument("sweep: give --config FILE or --model");
  const kiln::profile::SweepConfig config = kiln::profile::load_sweep_config(config_path, overrides);
  const bool main_rank = kiln::dist::read_dist_env().rank == 0;  // a data-parallel sweep: rank 0 reports
  const auto report = kiln::profile::run_sweep(config, [&](const kiln::profile::ProfileRow& r) {
    if (!main_rank) return;
    fmt::print(stderr, "kiln-profile: cutoff_len {} batch {} GA {}: {}\n", r.point.cutoff_len, r.point.batch_size,
               r.point.grad_accum, r.status == "ok" ? r.speed() : r.status);
  });
  if (!main_rank) return 0;
  fmt::print("{}", kiln::profile::to_markdown(report));
  std::fflush(stdout);
  // A fraction of a peak above 100% is a bug: said on stderr too, where a log keeps it.
  for (const auto& w : report.warnings) fmt::print(stderr, "kiln-profile: WARNING: {}\n", w);
  for (const auto& path : kiln::profile::write_reports(report, config.output_dir, config.formats)) {
    fmt::print(stderr, "kiln-profile: wrote {}\n", path);
  }
  return 0;
}

// kiln-profile reference: the reference runs' rows predicted (profile/reference_report.h).
int reference(const kiln::profile::Overrides& overrides) {
  const auto settings = kiln::profile::read_reference_settings(overrides);
  const auto report = kiln::profile::reference_report(settings.data, settings.host_costs);
  fmt::print("{}", settings.json ? kiln::profile::reference_json(report) : kiln::profile::reference_markdown(report));
  std::fflush(stdout);
  if (!settings.output_dir.empty()) {
    for (const auto& path : kiln::profile::write_reference_reports(report, settings.output_dir, settings.formats)) {
      fmt::print(stderr, "kiln-profile: wrote {}\n", path);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Opt-in, before the first tensor: keep a step's buffers in the heap (common/malloc_tuning.h).
  if (kiln::malloc_tuning_requested()) kiln::tune_malloc_for_training();
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
      print_help();
      return 0;
    }
    const std::string first = args.empty() ? "" : args[0];
    Command command = Command::kSweep;
    if (first == "sweep") {
      command = Command::kSweep;
    } else if (first == "plan") {
      command = Command::kPlan;
    } else if (first == "explain") {
      command = Command::kExplain;
    } else if (first == "reference") {
      command = Command::kReference;
    } else {
      // The modes of kiln-profile before its subcommands: say the new spelling.
      for (const std::string& old : {"--plan", "--explain"}) {
        if (std::find(args.begin(), args.end(), old) != args.end()) {
          throw std::invalid_argument(
              fmt::format("{} is now a subcommand: kiln-profile {} --KEY VALUE ... "
                          "(kiln-profile {} --help)",
                          old, old.substr(2), old.substr(2)));
        }
      }
      throw std::invalid_argument(fmt::format(
          "give a subcommand first: sweep, plan, explain or reference{} (kiln-profile --help; a measured sweep "
          "is kiln-profile sweep --config FILE or --model M ...)",
          first.empty() ? "" : fmt::format(", not '{}'", first)));
    }
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (std::find(rest.begin(), rest.end(), "-h") != rest.end() ||
        std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
      print_command_help(command);
      return 0;
    }
    // sweep reads `--config FILE` (given twice, the last wins, as every key) as the other programs
    // do; plan and explain take none, so there `--config` is refused as a key of another subcommand.
    const kiln::config::Spelling spelling = kiln::profile::command_spelling(command);
    std::string config_path;
    kiln::profile::Overrides overrides;
    if (command == Command::kSweep) {
      kiln::config::CommandLine line = kiln::config::parse_command_line(rest, spelling);
      config_path = std::move(line.config_path);
      overrides = std::move(line.overrides);
    } else {
      overrides = kiln::config::parse_overrides(rest, spelling);
    }
    switch (command) {
      case Command::kPlan:
        return plan(overrides);
      case Command::kExplain:
        return explain(overrides);
      case Command::kReference:
        return reference(overrides);
      case Command::kSweep:
        break;
    }
    return sweep(config_path, overrides);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-profile: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
