// kiln-profile: resource tables (speed, memory, MFU per cutoff_len, batch size, gradient
// accumulation and recomputation), measured by running the trainer's step and set beside the
// analytic FLOP and memory models (sweep); the memory planner (plan); the modelled traffic and
// FLOPs of one step (explain); the reference runs predicted (reference). The command line only:
// the settings are profile/settings.h's, the subcommands profile/command.h's.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.h"
#include "kiln/common/malloc_tuning.h"
#include "kiln/config/key_table.h"
#include "kiln/profile/command.h"

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
      "             accumulation (x recomputation), each point a short run of kiln-pretrain's step, beside the\n"
      "             analytic FLOP and memory models (docs/performance.md)\n"
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
  std::vector<kiln::config::KeyDoc> keys = kiln::profile::command_keys(command);
  if (command == Command::kSweep) {
    keys.insert(keys.begin(), {"config", "FILE",
                               "a configs/profile/*.yaml with these keys (the command line overrides it; given "
                               "twice, the last wins)"});
  }
  fmt::print("{}{}\n{}", kiln::profile::command_summary(command), kiln::config::keys_help(keys), kSpellingHelp);
}

// The subcommand named by the first argument; the modes of kiln-profile before its subcommands
// are told their new spelling.
Command command_of(const std::vector<std::string>& args) {
  const std::string first = args.empty() ? "" : args[0];
  for (const Command c : {Command::kSweep, Command::kPlan, Command::kExplain, Command::kReference}) {
    if (first == kiln::profile::command_name(c)) return c;
  }
  for (const std::string old : {"--plan", "--explain"}) {
    if (std::find(args.begin(), args.end(), old) != args.end()) {
      throw std::invalid_argument(
          fmt::format("{} is now a subcommand: kiln-profile {} --KEY VALUE ... (kiln-profile {} --help)", old,
                      old.substr(2), old.substr(2)));
    }
  }
  throw std::invalid_argument(
      fmt::format("give a subcommand first: sweep, plan, explain or reference{} (kiln-profile --help; a measured "
                  "sweep is kiln-profile sweep --config FILE or --model M ...)",
                  first.empty() ? "" : fmt::format(", not '{}'", first)));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = kiln::cli::arguments(argc, argv);
  try {
    // Opt-in, before the first tensor: keep a step's buffers in the heap (common/malloc_tuning.h).
    if (kiln::malloc_tuning_requested()) kiln::tune_malloc_for_training();
    if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
      print_help();
      return 0;
    }
    const Command command = command_of(args);
    // sweep reads `--config FILE` (given twice, the last wins, as every key) as the other programs
    // do; the others take none, so there `--config` is refused as a key of another subcommand.
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    const kiln::config::Spelling spelling = kiln::profile::command_spelling(command);
    kiln::config::CommandLine line;
    if (command == Command::kSweep) {
      line = kiln::config::parse_command_line(rest, spelling);
    } else {
      line.help = std::find(rest.begin(), rest.end(), "-h") != rest.end() ||
                  std::find(rest.begin(), rest.end(), "--help") != rest.end();
      if (!line.help) line.overrides = kiln::config::parse_overrides(rest, spelling);
    }
    if (line.help) {
      print_command_help(command);
      return 0;
    }
    if (command == Command::kSweep && line.config_path.empty() &&
        std::none_of(line.overrides.begin(), line.overrides.end(), [](const auto& kv) { return kv.first == "model"; }))
      throw std::invalid_argument("sweep: give --config FILE or --model");
    kiln::profile::run_command(command, line.config_path, line.overrides);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-profile: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
