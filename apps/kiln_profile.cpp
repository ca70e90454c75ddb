// kiln-profile: the user's resource tables (speed, memory, MFU per cutoff_len, batch size and
// gradient accumulation), measured by running the trainer's step and set beside the analytic
// FLOP and memory models, in one command. Markdown on stdout; CSV, JSON and HTML in --output.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/cuda.h>

#include "cli.h"
#include "kiln/common/device.h"
#include "kiln/common/malloc_tuning.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/plan.h"
#include "kiln/dist/env.h"
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
    ("model", "model preset (tiny, llama-100m, llama-3.2-1b) or model YAML", cxxopts::value<std::string>())
    ("cutoff-len", "comma-separated cutoff_len values", cxxopts::value<std::string>())
    ("batch-size", "comma-separated per-device batch sizes", cxxopts::value<std::string>())
    ("grad-accum", "comma-separated gradient_accumulation_steps", cxxopts::value<std::string>())
    ("dtype", "bf16 | fp16 | fp32 compute (parameters stay fp32)", cxxopts::value<std::string>())
    ("kernels", "ops backends as kiln-pretrain's key: kiln (default), aten, or per op, e.g. kiln,linear_ce=aten", cxxopts::value<std::string>())
    ("steps", "timed steps per point", cxxopts::value<int64_t>())
    ("warmup", "untimed steps before them", cxxopts::value<int64_t>())
    ("device", "auto | cpu | cuda", cxxopts::value<std::string>())
    ("dataset-dir", "token shards (default: synthetic random ids)", cxxopts::value<std::string>())
    ("gradient-checkpointing", "recompute each layer in backward")
    ("gradient-checkpointing-every", "with --gradient-checkpointing: recompute layers 0, n, 2n, ... only (every_n)", cxxopts::value<int64_t>())
    ("gradient-checkpointing-policy", "full, every_n (with --gradient-checkpointing-every) or selective (keep matmul outputs, recompute RMSNorm/SwiGLU); implies --gradient-checkpointing", cxxopts::value<std::string>())
    ("peak-tflops", "peak TFLOP/s for MFU instead of the device table", cxxopts::value<double>())
    ("memory-cap-bytes", "fail allocations past this many bytes as out-of-memory", cxxopts::value<int64_t>())
    ("format", "comma-separated: md,csv,json,html", cxxopts::value<std::string>())
    ("output", "directory for profile.{md,csv,json,html}", cxxopts::value<std::string>())
    ("trace", "after each point's timed steps, profile as many more (LibTorch's Kineto profiler, not timed) and write DIR/trace_T<cutoff>_B<batch>_A<accum>.json (Chrome trace: Perfetto; bench_vs_hf.py --op-profile sums it per op)", cxxopts::value<std::string>())
    ("task", "the table's task column", cxxopts::value<std::string>())
    ("zero-stage", "under torchrun/srun: ZeRO stage 0, 1 or 2 of the data-parallel step", cxxopts::value<int64_t>())
    ("ddp-bucket-cap-mb", "under torchrun/srun: gradient bucket size (MB)", cxxopts::value<int64_t>())
    ("plan", "plan instead of measuring: the settings that fit --device-memory per cutoff_len, ranked (docs/performance.md)")
    ("device-memory", "--plan: the device's memory (80GB, 16GiB, ...) or a device name: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-80GB, H200-141GB (default: this GPU's)", cxxopts::value<std::string>())
    ("target-tokens", "--plan: global batch per optimizer step, in tokens", cxxopts::value<int64_t>())
    ("target-sequences", "--plan: global batch per optimizer step, in sequences", cxxopts::value<int64_t>())
    ("world-size", "--plan: data-parallel ranks", cxxopts::value<int>())
    ("mfu", "--plan: assumed MFU for the predicted tokens/s (default 0.4)", cxxopts::value<double>())
    ("no-overlap", "under torchrun/srun: reduce every bucket after backward instead of during it (measures what the overlap hides)")
    ("h,help", "this text");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      fmt::print("{}\n", options.help());
      return 0;
    }
    if (!args.unmatched().empty()) throw std::invalid_argument("unexpected argument '" + args.unmatched()[0] + "'");
    if (args.count("plan")) return plan(args);
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
    for (const auto& path : kiln::profile::write_reports(report, config.output_dir, config.formats)) {
      fmt::print(stderr, "kiln-profile: wrote {}\n", path);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-profile: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
