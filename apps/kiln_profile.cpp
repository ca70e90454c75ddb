// kiln-profile: the user's resource tables (speed, memory, MFU per cutoff_len, batch size and
// gradient accumulation), measured by running the trainer's step and set beside the analytic
// FLOP and memory models, in one command. Markdown on stdout; CSV, JSON and HTML in --output.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.h"
#include "kiln/dist/env.h"
#include "kiln/profile/report.h"
#include "kiln/profile/sweep.h"

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

}  // namespace

int main(int argc, char** argv) {
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
    ("peak-tflops", "peak TFLOP/s for MFU instead of the device table", cxxopts::value<double>())
    ("memory-cap-bytes", "fail allocations past this many bytes as out-of-memory", cxxopts::value<int64_t>())
    ("format", "comma-separated: md,csv,json,html", cxxopts::value<std::string>())
    ("output", "directory for profile.{md,csv,json,html}", cxxopts::value<std::string>())
    ("task", "the table's task column", cxxopts::value<std::string>())
    ("zero-stage", "under torchrun/srun: ZeRO stage 0, 1 or 2 of the data-parallel step", cxxopts::value<int64_t>())
    ("ddp-bucket-cap-mb", "under torchrun/srun: gradient bucket size (MB)", cxxopts::value<int64_t>())
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
    if (args.count("peak-tflops")) config.peak_tflops = args["peak-tflops"].as<double>();
    if (args.count("memory-cap-bytes")) config.memory_cap_bytes = args["memory-cap-bytes"].as<int64_t>();
    if (args.count("format")) config.formats = split(args["format"].as<std::string>());
    if (args.count("output")) config.output_dir = args["output"].as<std::string>();
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
    fmt::print(stderr, "kiln-profile: error: {}\n", e.what());
    return 2;
  }
}
