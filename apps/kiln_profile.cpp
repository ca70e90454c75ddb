// kiln-profile: the user's resource tables (speed, memory, MFU per cutoff_len, batch size and
// gradient accumulation), measured by running the trainer's step and set beside the analytic
// FLOP and memory models, in one command. Markdown on stdout; CSV, JSON and HTML in --output.
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "kiln/common/device.h"
#include "kiln/common/malloc_tuning.h"
#include "kiln/cost/cpu_peak.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/plan.h"
#include "kiln/cost/traffic.h"
#include "kiln/dist/env.h"
#include "kiln/model/llama_config.h"
#include "kiln/ops/dispatch.h"
#include "kiln/profile/plan_report.h"
#include "kiln/profile/report.h"
#include "kiln/profile/sweep.h"
#include "kiln/train/kernel_choices.h"

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// kiln-profile --plan: the memory planner, from the analytic models only (nothing is allocated).
int plan(const cxxopts::ParseResult& args) {
  kiln::cost::PlanConfig c;
  if (!args.count("model")) throw std::invalid_argument("--plan: give --model");
  c.model = args["model"].as<std::string>();
  if (args.count("cutoff-len"))
    c.cutoff_lens = kiln::profile::parse_int_list(args["cutoff-len"].as<std::string>(), "--cutoff-len");
  if (args.count("dtype")) c.dtype = args["dtype"].as<std::string>();
  if (args.count("kernels")) c.kernels = args["kernels"].as<std::string>();
  const std::string device = args.count("device") ? args["device"].as<std::string>() : "auto";
  c.cuda = device != "cpu";
  if (args.count("device-memory")) {
    const std::string m = args["device-memory"].as<std::string>();
    if (const auto spec = kiln::cost::hardware_spec(m)) {
      c.device_memory_bytes = spec->memory_bytes;
      c.device_name = spec->name;
    } else {
      c.device_memory_bytes = kiln::cost::parse_bytes(m, "--device-memory");
    }
  } else if (c.cuda && torch::cuda::is_available()) {
    c.device_memory_bytes = kiln::device::device_memory_bytes(at::Device(at::kCUDA, 0));
  } else {
    throw std::invalid_argument("--plan: give --device-memory (e.g. 80GB or H100-80GB): no GPU here to ask");
  }
  if (args.count("target-tokens")) c.target_tokens = args["target-tokens"].as<int64_t>();
  if (args.count("target-sequences")) c.target_sequences = args["target-sequences"].as<int64_t>();
  if (args.count("world-size")) c.world_size = args["world-size"].as<int>();
  if (args.count("zero-stage")) c.zero_stage = static_cast<int>(args["zero-stage"].as<int64_t>());
  if (args.count("ddp-bucket-cap-mb")) c.ddp_bucket_cap_mb = args["ddp-bucket-cap-mb"].as<int64_t>();
  if (args.count("mfu")) c.mfu = args["mfu"].as<double>();
  if (args.count("peak-tflops")) c.peak_tflops = args["peak-tflops"].as<double>();
  c.kernel_choices = kiln::train::kernel_choices(c.kernels, c.dtype == "fp32" ? 4 : 2, c.cuda);
  const auto report = kiln::cost::make_plan(c);
  fmt::print("{}", kiln::profile::plan_markdown(report));
  std::fflush(stdout);
  const std::vector<std::string> formats = args.count("format") ? split(args["format"].as<std::string>())
                                                                : std::vector<std::string>{"md", "csv", "json", "html"};
  const std::string out = args.count("output") ? args["output"].as<std::string>() : "profile";
  for (const auto& path : kiln::profile::write_plan_reports(report, out, formats)) {
    fmt::print(stderr, "kiln-profile: wrote {}\n", path);
  }
  return 0;
}

// One value of a list option (--cutoff-len 1024), `fallback` when it is absent.
int64_t one_value(const cxxopts::ParseResult& args, const std::string& name, std::optional<int64_t> fallback) {
  if (!args.count(name)) {
    if (!fallback) throw std::invalid_argument("--explain: give --" + name);
    return *fallback;
  }
  const auto values = kiln::profile::parse_int_list(args[name].as<std::string>(), "--" + name);
  if (values.size() != 1) throw std::invalid_argument("--explain: --" + name + " takes one value");
  return values[0];
}

// kiln-profile --explain: the traffic and FLOP model of one step, per component (cost/traffic.h),
// from the model's config alone: no weights, no tensors, nothing run.
int explain(const cxxopts::ParseResult& args) {
  namespace cost = kiln::cost;
  // Six significant digits (the Python test sums rows against them), whole numbers from a million.
  auto num = [](double x) { return std::abs(x) >= 1e6 ? fmt::format("{:.0f}", x) : fmt::format("{:.6g}", x); };
  if (!args.count("model")) throw std::invalid_argument("--explain: give --model");
  const std::string model_name = args["model"].as<std::string>();
  const kiln::model::LlamaConfig model = kiln::model::load_llama_config(model_name);
  cost::TrafficOptions o;
  o.seq_len = one_value(args, "cutoff-len", std::nullopt);
  o.batch = one_value(args, "batch-size", std::nullopt);
  o.grad_accum = one_value(args, "grad-accum", 1);
  if (args.count("dtype")) o.dtype = args["dtype"].as<std::string>();
  const std::string kernels = args.count("kernels") ? args["kernels"].as<std::string>() : kiln::ops::kDefaultKernels;
  if (args.count("world-size")) o.world_size = args["world-size"].as<int>();
  if (args.count("zero-stage")) o.zero_stage = static_cast<int>(args["zero-stage"].as<int64_t>());
  // kiln-pretrain's and the sweep's rule (train/recomputation.h): --explain models what they run.
  kiln::profile::set_traffic_recomputation(
      o, kiln::train::resolve_recomputation(
             args.count("gradient-checkpointing") || args.count("gradient-checkpointing-policy"),
             args.count("gradient-checkpointing-policy") ? args["gradient-checkpointing-policy"].as<std::string>() : "",
             args.count("gradient-checkpointing-every") ? args["gradient-checkpointing-every"].as<int64_t>() : 0));

  // The hardware row: a device of cost/hardware.h by name, this machine's GPU, or with --device cpu
  // this CPU (its theoretical peaks, cost/cpu_peak.h, and a measured copy bandwidth).
  std::optional<cost::HardwareSpec> hw;
  const bool cpu = args.count("device") && args["device"].as<std::string>() == "cpu";
  std::string bandwidth_source;
  if (cpu) {
    std::string why;
    const auto peak = cost::this_cpu_peak(&why);
    if (!peak) throw std::invalid_argument("--explain --device cpu: no theoretical CPU peak: " + why);
    const double bandwidth = kiln::device::measure_cpu_copy_bandwidth();
    hw = cost::cpu_hardware_spec(*peak, bandwidth, kiln::device::device_memory_bytes(at::Device(at::kCPU)));
    bandwidth_source = fmt::format("measured: STREAM-like copy of 64 MiB fp32, {:.1f} GB/s", bandwidth / 1e9);
  } else if (args.count("device-memory")) {
    hw = cost::hardware_spec(args["device-memory"].as<std::string>());
  } else if (torch::cuda::is_available()) {
    const at::Device gpu(at::kCUDA, 0);
    hw = cost::hardware_for_device_name(kiln::device::name(gpu), kiln::device::device_memory_bytes(gpu));
  }
  if (!hw) {
    std::string names;
    for (const auto& spec : cost::hardware_specs()) names += (names.empty() ? "" : ", ") + spec.name;
    throw std::invalid_argument("--explain: give --device-memory with a device name (" + names + ") or --device cpu");
  }
  if (bandwidth_source.empty()) bandwidth_source = hw->source;

  // The kernels the step runs, from ops' own rules, as kiln-profile's sweep takes them
  // (profile/sweep.h: train/kernel_choices.h for the fused ops; RoPE and attention from the spec
  // and the device).
  kiln::profile::set_traffic_kernels(o, kernels, !cpu, &*hw, model.resolved_head_dim());
  const cost::TrafficReport r = cost::traffic_model(model, o);
  cost::Roofline roof = cost::roofline(*hw, o.dtype);
  if (args.count("peak-tflops")) roof.gemm_flops_per_s = args["peak-tflops"].as<double>() * 1e12;
  if (args.count("json")) {
    std::string text = kiln::profile::explain_json(model_name, r, roof, bandwidth_source);
    if (args.count("step-seconds")) {  // the same modelled counters the Markdown prints
      const double s = args["step-seconds"].as<double>();
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

  const std::string policy = o.recompute == "every_n" ? fmt::format("every_{}", o.every) : o.recompute;
  fmt::print(
      "# kiln explain: {} ({} parameters), {}{}, micro-batch {} x cutoff_len {}, gradient_accumulation_steps {} "
      "({} tokens per step{}), recomputation {}, kernels {}, {}\n\n",
      model_name, r.num_parameters, o.dtype, o.dtype == "fp32" ? "" : " autocast over fp32 parameters", o.batch,
      o.seq_len, o.grad_accum, static_cast<int64_t>(r.tokens_per_step),
      o.world_size > 1 ? fmt::format(" per rank, {} ranks, ZeRO stage {}", o.world_size, o.zero_stage) : "", policy,
      kernels, hw->name);
  const bool autocast = o.dtype != "fp32";
  fmt::print("Ops: RMSNorm {}, SwiGLU {}, RoPE {}, attention {}, loss head {}.\n",
             o.kernels.fused_rmsnorm ? "kiln kernel" : "ATen composition",
             o.kernels.fused_swiglu ? "kiln kernel" : "ATen composition",
             o.fused_rope && !autocast                        ? "kiln kernel (in place)"
             : o.fused_rope && autocast && o.mixed_rope_fused ? "kiln mixed-dtype kernel (bf16/fp16 q, k into fp32)"
             : autocast ? "ATen composition (bf16/fp16 q, k with fp32 tables: ops/rope.cpp)"
                        : "ATen composition",
             o.attention == "flash" ? "kiln flash kernels" : "ATen SDPA (" + o.attention + ")",
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
  if (args.count("step-seconds")) {
    // The user's three counters for a measured step time, as the model says they should read.
    const double s = args["step-seconds"].as<double>();
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

// Each mode reads only its own options: one given to another mode would be silently ignored, so
// it is an error naming the option and the mode (--plan and --explain run nothing; the sweep
// has no device name, target or assumed MFU).
void check_mode_options(const cxxopts::ParseResult& args) {
  if (args.count("plan") && args.count("explain")) throw std::invalid_argument("give --plan or --explain, not both");
  if (args.count("device")) {  // --plan and --explain read it too, and took any other word for a GPU
    const std::string device = args["device"].as<std::string>();
    if (device != "auto" && device != "cpu" && device != "cuda") {
      throw std::invalid_argument(fmt::format("--device: '{}' is not auto, cpu or cuda", device));
    }
  }
  const std::set<std::string> plan_options = {"plan",
                                              "model",
                                              "cutoff-len",
                                              "dtype",
                                              "kernels",
                                              "device",
                                              "device-memory",
                                              "target-tokens",
                                              "target-sequences",
                                              "world-size",
                                              "mfu",
                                              "peak-tflops",
                                              "zero-stage",
                                              "ddp-bucket-cap-mb",
                                              "format",
                                              "output"};
  const std::set<std::string> explain_options = {"explain",
                                                 "model",
                                                 "cutoff-len",
                                                 "batch-size",
                                                 "grad-accum",
                                                 "dtype",
                                                 "kernels",
                                                 "device",
                                                 "device-memory",
                                                 "world-size",
                                                 "zero-stage",
                                                 "peak-tflops",
                                                 "step-seconds",
                                                 "json",
                                                 "gradient-checkpointing",
                                                 "gradient-checkpointing-every",
                                                 "gradient-checkpointing-policy"};
  const std::set<std::string> not_sweep_options = {
      "device-memory", "target-tokens", "target-sequences", "world-size", "mfu", "step-seconds", "json"};
  const char* mode = args.count("plan") ? "--plan" : args.count("explain") ? "--explain" : nullptr;
  for (const auto& kv : args.arguments()) {
    const std::string& key = kv.key();
    const bool applies = mode == nullptr                 ? not_sweep_options.count(key) == 0
                         : std::string(mode) == "--plan" ? plan_options.count(key) > 0
                                                         : explain_options.count(key) > 0;
    if (!applies) {
      throw std::invalid_argument(
          fmt::format("--{} does not apply to {} (kiln-profile --help says which mode reads it)", key,
                      mode ? mode : "a measured sweep"));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Opt-in, before the first tensor: keep a step's buffers in the heap (common/malloc_tuning.h).
  if (kiln::malloc_tuning_requested()) kiln::tune_malloc_for_training();
  cxxopts::Options options("kiln-profile",
                           "Measures training speed and memory over a grid of cutoff_len x batch size x gradient "
                           "accumulation, beside the analytic FLOP and memory models (docs/performance.md).");
  // clang-format off
  options.add_options()
    ("config", "a configs/profile/*.yaml grid (command-line options override it)", cxxopts::value<std::string>())
    ("model", "model preset (tiny, llama-100m, llama-3.2-1b), model YAML, or an HF folder or its config.json", cxxopts::value<std::string>())
    ("cutoff-len", "comma-separated cutoff_len values", cxxopts::value<std::string>())
    ("batch-size", "comma-separated per-device batch sizes", cxxopts::value<std::string>())
    ("grad-accum", "comma-separated gradient_accumulation_steps", cxxopts::value<std::string>())
    ("dtype", "bf16 | fp16 | fp32 compute (parameters stay fp32)", cxxopts::value<std::string>())
    ("kernels", "ops backends as kiln-pretrain's key: kiln,attention=aten (default: kiln's kernels, SDPA's attention), kiln (every op, kiln's flash attention too), aten, or per op, e.g. kiln,linear_ce=aten", cxxopts::value<std::string>())
    ("steps", "timed steps per point", cxxopts::value<int64_t>())
    ("warmup", "untimed steps before them", cxxopts::value<int64_t>())
    ("device", "auto | cpu | cuda (--explain: cpu takes this CPU's theoretical peak and measured bandwidth)", cxxopts::value<std::string>())
    ("dataset-dir", "token shards (default: synthetic random ids)", cxxopts::value<std::string>())
    ("gradient-checkpointing", "recompute each layer in backward")
    ("gradient-checkpointing-every", "with --gradient-checkpointing: recompute layers 0, n, 2n, ... only (n >= 2: every_n, kiln-pretrain's gradient_checkpointing_every)", cxxopts::value<int64_t>())
    ("gradient-checkpointing-policy", "full, every_n (n: --gradient-checkpointing-every, default 2) or selective (keep matmul outputs, recompute RMSNorm/SwiGLU); left out: every_n when --gradient-checkpointing-every >= 2, else full; implies --gradient-checkpointing", cxxopts::value<std::string>())
    ("peak-tflops", "peak TFLOP/s for MFU (and --explain's roofline) instead of the device table", cxxopts::value<double>())
    ("memory-cap-bytes", "fail allocations past this many bytes as out-of-memory", cxxopts::value<int64_t>())
    ("format", "comma-separated: md,csv,json,html", cxxopts::value<std::string>())
    ("output", "directory for profile.{md,csv,json,html} (with csv also profile_components.csv)", cxxopts::value<std::string>())
    ("trace", "after each point's timed steps, profile as many more (LibTorch's Kineto profiler, not timed) and write DIR/trace_T<cutoff>_B<batch>_A<accum>.json (Chrome trace: Perfetto; bench_vs_hf.py --op-profile sums it per op)", cxxopts::value<std::string>())
    ("task", "the table's task column", cxxopts::value<std::string>())
    ("zero-stage", "under torchrun/srun: ZeRO stage 0, 1 or 2 of the data-parallel step", cxxopts::value<int64_t>())
    ("ddp-bucket-cap-mb", "under torchrun/srun: gradient bucket size (MB)", cxxopts::value<int64_t>())
    ("plan", "plan instead of measuring: the settings that fit --device-memory per cutoff_len, ranked (docs/performance.md)")
    ("device-memory", "--plan: the device's memory (80GB, 16GiB, ...) or a device name; --explain: a device name. Names: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-80GB, H200-141GB (SXM), V100-PCIe-16GB, V100-PCIe-32GB, A100-PCIe-40GB, A100-PCIe-80GB, H100-PCIe-80GB (default: this GPU's)", cxxopts::value<std::string>())
    ("target-tokens", "--plan: global batch per optimizer step, in tokens", cxxopts::value<int64_t>())
    ("target-sequences", "--plan: global batch per optimizer step, in sequences", cxxopts::value<int64_t>())
    ("world-size", "--plan, --explain: data-parallel ranks", cxxopts::value<int>())
    ("mfu", "--plan: assumed MFU for the predicted tokens/s (default 0.4)", cxxopts::value<double>())
    ("explain", "print the modelled FLOPs and memory traffic of one step per component (kiln and an eager HF step), "
                "for one --model, --cutoff-len, --batch-size, --grad-accum on a --device-memory device name or --device cpu; "
                "nothing runs (cost/traffic.h)")
    ("step-seconds", "--explain: a measured step time; prints the modelled memory bandwidth, tensor core and fp engine use at it", cxxopts::value<double>())
    ("json", "--explain: print the per-component rows and totals as JSON instead of Markdown")
    ("counters", "read hardware counters (perf_event on the CPU, CUPTI on a GPU: one range over the counted steps) over --counter-steps more steps after each point's timed ones; the counted memory bandwidth, tensor core and fp engine columns sit beside the modelled ones (docs/performance.md)")
    ("counter-phases", "with --counters: count forward, backward and the optimizer apart as well (the per-phase table beside the traffic model's rows; on a GPU a device synchronisation at each phase boundary of the counted steps); implies --counters")
    ("counter-steps", "with --counters: steps counted per point (default: as many as --steps)", cxxopts::value<int64_t>())
    ("counters-per-kernel", "--counters on a GPU with one CUPTI range per kernel (each kernel's columns in profile.json); CUPTI serialises the kernels, so the counted steps run much slower; implies --counters")
    ("component-times", "measure each component's time (the per-component table's measured column) over as many steps again under LibTorch's profiler after each point's timed ones: its ops' CPU time on a CPU, the GPU time of the kernels they launch on a GPU (docs/performance.md, \"Measured time per component\")")
    ("no-overlap", "under torchrun/srun: reduce every bucket after backward instead of during it (measures what the overlap hides)")
    ("h,help", "this text");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      fmt::print("{}\n", options.help());
      return 0;
    }
    check_mode_options(args);
    if (args.count("plan")) return plan(args);
    if (args.count("explain")) return explain(args);
    kiln::profile::SweepConfig config;
    if (args.count("config")) config = kiln::profile::load_sweep_config(args["config"].as<std::string>());
    const bool overridden =
        args.count("model") || args.count("cutoff-len") || args.count("batch-size") || args.count("grad-accum");
    if (!args.count("config") && !args.count("model")) throw std::invalid_argument("give --model or --config");
    if (overridden) config.source = args.count("config") ? config.source + " + command line" : "command line";
    if (args.count("model")) config.model = args["model"].as<std::string>();
    if (args.count("cutoff-len"))
      config.cutoff_lens = kiln::profile::parse_int_list(args["cutoff-len"].as<std::string>(), "--cutoff-len");
    if (args.count("batch-size"))
      config.batch_sizes = kiln::profile::parse_int_list(args["batch-size"].as<std::string>(), "--batch-size");
    if (args.count("grad-accum"))
      config.grad_accums = kiln::profile::parse_int_list(args["grad-accum"].as<std::string>(), "--grad-accum");
    if (args.count("dtype")) config.dtype = args["dtype"].as<std::string>();
    if (args.count("kernels")) config.kernels = args["kernels"].as<std::string>();
    if (args.count("steps")) config.steps = args["steps"].as<int64_t>();
    if (args.count("warmup")) config.warmup = args["warmup"].as<int64_t>();
    if (args.count("device")) config.device = args["device"].as<std::string>();
    if (args.count("dataset-dir")) config.dataset_dir = args["dataset-dir"].as<std::string>();
    if (args.count("gradient-checkpointing")) config.gradient_checkpointing = true;
    if (args.count("gradient-checkpointing-every"))
      config.gradient_checkpointing_every = args["gradient-checkpointing-every"].as<int64_t>();
    if (args.count("gradient-checkpointing-policy")) {
      config.gradient_checkpointing = true;
      config.gradient_checkpointing_policy = args["gradient-checkpointing-policy"].as<std::string>();
    }
    if (args.count("peak-tflops")) config.peak_tflops = args["peak-tflops"].as<double>();
    if (args.count("memory-cap-bytes")) config.memory_cap_bytes = args["memory-cap-bytes"].as<int64_t>();
    if (args.count("format")) config.formats = split(args["format"].as<std::string>());
    if (args.count("output")) config.output_dir = args["output"].as<std::string>();
    if (args.count("trace")) config.trace_dir = args["trace"].as<std::string>();
    if (args.count("task")) config.task = args["task"].as<std::string>();
    if (args.count("zero-stage")) config.zero_stage = args["zero-stage"].as<int64_t>();
    if (args.count("ddp-bucket-cap-mb")) config.ddp_bucket_cap_mb = args["ddp-bucket-cap-mb"].as<int64_t>();
    if (args.count("no-overlap")) config.ddp_overlap = false;
    if (args.count("counters")) config.counters = true;
    if (args.count("counters-per-kernel")) config.counters = config.counters_per_kernel = true;
    if (args.count("counter-phases")) config.counters = config.counter_phases = true;
    if (args.count("counter-steps")) config.counter_steps = args["counter-steps"].as<int64_t>();
    if (args.count("component-times")) config.component_times = true;
    config.validate();

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
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-profile: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
