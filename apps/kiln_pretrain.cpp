// kiln-pretrain: pretrain or continue pretraining a LLaMA from a YAML config (LLaMA-Factory key
// names), every key overridable as --key value. With no config, the embedded quick start.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.h"
#include "kiln/common/env.h"
#include "kiln/common/process_settings.h"
#include "kiln/common/runtime_info.h"
#include "kiln/config/key_table.h"
#include "kiln/config/yaml.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/env.h"
#include "kiln/io/safetensors.h"
#include "kiln/train/hf/lf_keys.h"
#include "kiln/train/pretrain_keys.h"
#include "kiln/train/run_plan.h"
#include "kiln/train/stop_request.h"
#include "kiln/train/trainer.h"

namespace {

void print_help() {
  fmt::print(
      "Usage: kiln-pretrain [--config FILE|PRESET] [--dry-run [--dump-data FILE]] [--KEY VALUE ...]\n"
      "       kiln-pretrain --list-keys\n\n"
      "Trains a LLaMA as configured by FILE (YAML with LLaMA-Factory key names) or a preset of\n"
      "configs/pretrain (default: quickstart, the tiny model on the embedded corpus). Every key can\n"
      "be given or overridden on the command line as --KEY VALUE or --KEY=VALUE, with '-' for '_' if you\n"
      "like (--cutoff-len 64); a boolean key alone means true (--bf16, --dry-run).\n\n"
      "  --config FILE    the run's YAML (or a preset name: quickstart, llama-100m, ...)\n"
      "  --auto-fit       let the memory planner choose micro-batch, accumulation and recomputation\n"
      "                   for this cutoff_len within the device's memory, keeping the global batch\n"
      "                   (key auto_fit; auto_fit_memory: 80GB or A100-80GB instead of the device's)\n"
      "  --dry-run        read the config and the data, print the banner and the predicted\n"
      "                   memory (no weights or optimizer state are allocated), and exit\n"
      "  --dump-data FILE with --dry-run: write the train and eval examples (token ids and labels),\n"
      "                   the banner's figures and the first epochs' order as JSON to FILE\n"
      "  --list-keys      print every key kiln-pretrain reads as JSON, {{key: acted | accepted | refused}}\n"
      "                   (the key table's classification; LLaMA-Factory's fields: docs/training.md)\n"
      "  -h, --help       this text\n\n"
      "Keys:");
  int col = 0;
  for (const auto& k : kiln::train::pretrain_config_keys()) {
    if (col + k.size() > 90) {
      fmt::print("\n ");
      col = 0;
    }
    fmt::print(" {}", k);
    col += static_cast<int>(k.size()) + 1;
  }
  fmt::print(
      "\nLLaMA-Factory's and HF TrainingArguments' other keys (report_to, do_eval, eval_strategy, optim,\n"
      "stage, template, ...) are acted on, accepted with an info line or refused: --list-keys, docs/training.md.\n"
      "\nSee docs/training.md. SIGINT/SIGTERM save a checkpoint of the last completed step and exit 0\n"
      "(nothing is saved when no step was completed since the start).\n"
      "Data parallel (docs/distributed.md): launch with torchrun --no-python --nproc-per-node N kiln-pretrain ...\n"
      "or srun; keys zero_stage (0, 1, 2), ddp_bucket_cap_mb, ddp_timeout, deepspeed. Each rank's CPU\n"
      "threads are OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else its CPUs (affinity, or its share).\n"
      "resume_from_checkpoint (a checkpoint-N, or true: the newest in output_dir) takes kiln's checkpoints\n"
      "and transformers' / LLaMA-Factory's (optimizer.pt, scheduler.pt); kiln's checkpoints hold those too,\n"
      "so LLaMA-Factory continues them (docs/training.md, \"Moving a run between LLaMA-Factory and kiln\").\n"
      "KILN_MALLOC_TUNING=1 raises glibc's malloc thresholds (faster small CPU steps; see docs/training.md).\n");
}

// kiln-pretrain's own flags beside the config's keys, read by the same reader (a bool as any
// boolean key: --dry-run alone or --dry-run true); the config's keys pass through, in order.
struct ProgramFlags {
  bool dry_run = false;
  std::string dump_data;
  std::vector<std::pair<std::string, std::string>> config_overrides;
};

const kiln::config::KeyTable<ProgramFlags>& program_table() {
  static const kiln::config::KeyTable<ProgramFlags> table = {{"dry_run", &ProgramFlags::dry_run},
                                                             {"dump_data", &ProgramFlags::dump_data}};
  return table;
}

kiln::config::Spelling program_spelling() {
  kiln::config::Spelling s = kiln::train::pretrain_spelling();
  for (const auto& key : program_table()) s.keys.push_back(key.name);
  const auto own = kiln::config::boolean_keys(program_table());
  s.switches.insert(s.switches.end(), own.begin(), own.end());
  return s;
}

ProgramFlags read_program_flags(const std::vector<std::pair<std::string, std::string>>& overrides) {
  ProgramFlags flags;
  std::vector<std::pair<std::string, std::string>> own;
  for (const auto& kv : overrides) {
    const bool program_key = std::any_of(program_table().begin(), program_table().end(),
                                         [&](const auto& key) { return key.name == kv.first; });
    (program_key ? own : flags.config_overrides).push_back(kv);
  }
  kiln::config::ConfigReader reader = kiln::config::overrides_reader(own);
  kiln::config::read_keys(reader, flags, program_table());
  return flags;
}

// "[rank 3] " when launched by torchrun or srun, so that an error names the process it came from.
std::string rank_prefix() {
  try {
    const auto env = kiln::dist::read_dist_env();
    return env.distributed() ? fmt::format("[rank {}] ", env.rank) : "";
  } catch (const std::exception&) {
    return "";
  }
}

// Under srun or torchrun each rank runs on its share of the host's CPUs (docs/distributed.md,
// "CPU threads per rank"); 0 for a process alone. A malformed launcher environment is the
// trainer's error to report, with its message.
int rank_threads() {
  try {
    std::optional<int> omp;
    if (const auto v = kiln::env::string("OMP_NUM_THREADS")) omp = std::atoi(v->c_str());  // OpenMP's: "4" or "4,2"
    return kiln::dist::rank_cpu_threads(kiln::dist::read_dist_env(), omp, kiln::dist::affinity_cpu_count(),
                                        kiln::dist::online_cpu_count());
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A stop may come at any moment, during set-up too: the handlers first (docs/training.md, "Stopping").
  kiln::train::install_stop_signal_handlers();
  // This program's process settings (common/process_settings.h), before the first tensor. Silent:
  // an error stays the one line on stderr; --help and docs/training.md say them.
  try {
    if (kiln::malloc_tuning_requested()) kiln::tune_malloc_for_training();
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-pretrain: error: {}\n", e.what());
    return 2;
  }
  kiln::pin_cpu_math_threads(rank_threads());
  const std::vector<std::string> args = kiln::cli::arguments(argc, argv);
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      print_help();
      return 0;
    }
    if (a == "--list-keys") {  // reads nothing else: the key table's classification
      fmt::print("{}\n", kiln::train::key_classes_json());
      return 0;
    }
  }
  try {
    // One grammar with every kiln program (config/key_table.h): --config FILE, then the keys, the
    // program's own (dry_run, dump_data) beside the config's.
    const kiln::config::CommandLine line = kiln::config::parse_command_line(args, program_spelling());
    const ProgramFlags flags = read_program_flags(line.overrides);
    if (!flags.dump_data.empty() && !flags.dry_run) throw std::invalid_argument("--dump-data needs --dry-run");
    const bool dry_run = flags.dry_run;
    const std::string& dump_path = flags.dump_data;
    const auto config = kiln::train::load_pretrain_config(line.config_path.empty() ? "quickstart" : line.config_path,
                                                          flags.config_overrides);
    if (config.full_determinism) kiln::set_cublas_deterministic_workspace();
    if (dry_run) {  // a plan (train/run_plan.h): nothing allocated, no process group
      const kiln::train::RunPlan plan = kiln::train::plan_run(config);
      if (plan.env.rank == 0) fmt::print("{}\n", kiln::train::run_banner(plan));
      if (!dump_path.empty() && plan.env.rank == 0) {
        kiln::io::write_file_atomic(dump_path, kiln::train::examples_json(plan) + "\n");
      }
      return 0;
    }
    // What this run has: the LibTorch build, the CUDA runtime and driver, every GPU (README.md,
    // "V100 and CUDA 12"), on stdout before the banner (stderr stays one line on an error). On
    // rank 0 only: the ranks of a node see the same.
    if (kiln::dist::read_dist_env().rank == 0) fmt::print("kiln-pretrain: {}\n", kiln::runtime_info().summary());
    kiln::train::Trainer trainer(config);
    const bool main_rank = trainer.rank() == 0;  // only rank 0 of a data-parallel job prints
    if (main_rank) fmt::print("{}\n", trainer.banner());
    std::fflush(stdout);
    trainer.set_progress_bar(true);
    const auto result = trainer.train();
    // The process groups in order, here, where an error still sets the exit status (an exception
    // before this point aborts them instead: dist/comm.h, docs/distributed.md "Shutdown").
    if (auto* comm = trainer.comm()) comm->shutdown();
    if (!main_rank) return 0;
    fmt::print("kiln-pretrain: {} at step {}; checkpoint {}{}\n", result.interrupted ? "interrupted" : "finished",
               result.global_step, result.last_checkpoint,
               result.interrupted ? "" : fmt::format("; final model in {}", config.output_dir));
    if (result.final_eval) {
      fmt::print("kiln-pretrain: eval loss {:.4f}, perplexity {:.3f}\n", result.final_eval->loss,
                 result.final_eval->perplexity);
    }
    return 0;
  } catch (const kiln::train::StopRequested& e) {
    fmt::print(stderr, "kiln-pretrain: {}{}\n", rank_prefix(), e.what());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-pretrain: {}error: {}\n", rank_prefix(), kiln::cli::error_text(e));
    return 2;
  }
}
