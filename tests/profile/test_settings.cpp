// kiln-profile's settings (profile/settings.h): a PretrainConfig plus a grid, the sweep's YAML and
// its command line read with kiln-pretrain's keys, rules and words; plan and explain select theirs; the device they
// describe resolved by common/device.h. References: the YAML files of configs/profile, kiln-pretrain's own reader
// (train/pretrain_config.h) and its defaults, and torch::cuda::is_available() for what auto means on this machine.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/config/key_table.h"
#include "kiln/profile/settings.h"
#include "kiln/train/pretrain_config.h"
#include "support.h"

using Catch::Matchers::Contains;
using kiln::profile::Command;
using kiln::test::error_of;

namespace {

kiln::profile::ProfileSettings load_sweep_config(const std::string& path, const kiln::profile::Overrides& o = {}) {
  return kiln::profile::read_settings(Command::kSweep, path, o);
}

std::string write_yaml(const std::string& name, const std::string& text) {
  static const auto dir = kiln::test::scratch_dir("profile_settings");
  const auto path = dir / name;
  std::ofstream(path) << text;
  return path.string();
}

kiln::profile::Overrides cli(Command command, const std::vector<std::string>& args) {
  return kiln::config::parse_overrides(args, kiln::profile::command_spelling(command));
}

const std::string kConfigs = KILN_PROFILE_CONFIGS;

}  // namespace

TEST_CASE("the sweep reads the same keys from its YAML and from the command line", "[profile][config]") {
  // configs/profile/ci-tiny.yaml, and the same settings as command-line keys (snake and kebab case).
  const auto file = load_sweep_config(kConfigs + "/ci-tiny.yaml");
  const auto line =
      load_sweep_config("", cli(Command::kSweep, {"--model",       "tiny",      "--dtype",      "fp32",
                                                  "--cutoff_len",  "16,64",     "--batch-size", "1,2",
                                                  "--grad-accum",  "1",         "--steps",      "2",
                                                  "--warmup",      "1",         "--device",     "cpu",
                                                  "--peak-tflops", "1.0",       "--format",     "md,csv,json,html",
                                                  "--output",      "profile-ci"}));
  for (const auto& c : {file, line}) {
    CHECK(c.run.model == "tiny");
    CHECK(c.dtype == "fp32");
    CHECK(c.cutoff_len == std::vector<int64_t>{16, 64});
    CHECK(c.per_device_train_batch_size == std::vector<int64_t>{1, 2});
    CHECK(c.gradient_accumulation_steps == std::vector<int64_t>{1});
    CHECK(c.steps == 2);
    CHECK(c.warmup == 1);
    CHECK(c.run.device == "cpu");
    CHECK(c.peak_tflops == 1.0);
    CHECK(c.formats == std::vector<std::string>{"md", "csv", "json", "html"});
    CHECK(c.run.output_dir == "profile-ci");
  }
  CHECK(line.source == "command line");
  // Every configs/profile file loads.
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs)) {
    INFO(entry.path());
    CHECK_NOTHROW(load_sweep_config(entry.path().string()));
  }
}

TEST_CASE("the command line overrides the sweep's YAML key by key, the last of a repeated key winning",
          "[profile][config]") {
  const std::string path =
      write_yaml("grid.yaml", "model: tiny\ncutoff_len: [16, 64]\nsteps: 5\nlearning_rate: 1e-3\n");
  const auto c = load_sweep_config(path, cli(Command::kSweep, {"--steps", "2", "--cutoff-len", "32", "--steps=1",
                                                               "--no-overlap", "--counter-phases"}));
  CHECK(c.cutoff_len == std::vector<int64_t>{32});
  CHECK(c.steps == 1);
  CHECK_FALSE(c.ddp_overlap);
  CHECK(c.counters);  // implied by counter_phases
  CHECK(c.run.learning_rate == 1e-3);
  CHECK(c.source == path + " + command line");
}

TEST_CASE("the sweep's optimisation keys are kiln-pretrain's: its reader, defaults and checks", "[profile][config]") {
  const kiln::train::PretrainConfig defaults;
  const auto plain = load_sweep_config("", cli(Command::kSweep, {"--model", "tiny"}));
  CHECK(plain.run.learning_rate == defaults.learning_rate);
  CHECK(plain.run.max_grad_norm == defaults.max_grad_norm);
  CHECK(plain.run.lr_scheduler_type == defaults.lr_scheduler_type);
  const auto c = load_sweep_config(
      "", cli(Command::kSweep, {"--model", "tiny", "--learning_rate", "3e-4", "--lr_scheduler_type", "cosine",
                                "--max_grad_norm", "0", "--warmup_steps", "2", "--adam_beta2", "0.95"}));
  CHECK(c.run.learning_rate == 3e-4);
  CHECK(c.run.lr_scheduler_type == "cosine");
  CHECK(c.run.max_grad_norm == 0);
  CHECK(c.run.warmup_steps == 2);
  CHECK(c.run.adam_beta2 == 0.95);
  // kiln-pretrain's own words for a bad value, with the sweep's source.
  const std::string path = write_yaml("bad_lr.yaml", "model: tiny\nlr_scheduler_type: cosinus\n");
  const std::string pretrain =
      error_of([&] { kiln::train::pretrain_config_from_yaml_text("model: tiny\nlr_scheduler_type: cosinus\n", path); });
  CHECK(!pretrain.empty());
  CHECK(error_of([&] { load_sweep_config(path); }) == pretrain);
  // A kiln-pretrain key the sweep does not run is unknown here, not silently ignored.
  CHECK_THAT(error_of([] {
               load_sweep_config("", cli(Command::kSweep, {"--model", "tiny", "--num_train_epochs", "2"}));
             }),
             Contains("command line: key 'num_train_epochs': unknown key") &&
                 Contains("kiln-profile sweep --help lists its keys"));
}

TEST_CASE("the sweep's bad input names the file or the command line and the key", "[profile][config]") {
  auto file_error = [](const std::string& name, const std::string& text) {
    const std::string path = write_yaml(name, text);
    const std::string e = error_of([&] { load_sweep_config(path); });
    CHECK_THAT(e, Contains(path));
    return e;
  };
  CHECK_THAT(file_error("no_model.yaml", "cutoff_len: [16]\n"), Contains("key 'model': missing required key"));
  CHECK_THAT(file_error("typo.yaml", "model: tiny\ncutoff_lens: [16]\n"),
             Contains("key 'cutoff_lens': unknown key") && Contains("kiln-profile sweep --help"));
  CHECK_THAT(file_error("twice.yaml", "model: tiny\nsteps: 1\nsteps: 2\n"),
             Contains("key 'steps'") && Contains("more than once"));
  CHECK_THAT(file_error("zero.yaml", "model: tiny\ncutoff_len: [16, 0]\n"),
             Contains("key 'cutoff_len': 0 is not positive"));
  CHECK_THAT(file_error("seed.yaml", "model: tiny\nseed: -1\n"), Contains("key 'seed': -1 is negative"));
  CHECK_THAT(file_error("device.yaml", "model: tiny\ndevice: gpu\n"),
             Contains("key 'device': 'gpu' is not auto, cpu or cuda"));
  // Contradictory keys: kiln-pretrain's recomputation rule (a policy needs gradient_checkpointing).
  CHECK_THAT(file_error("every.yaml", "model: tiny\ngradient_checkpointing_every: 4\n"),
             Contains("key 'gradient_checkpointing_every'") && Contains("no effect without gradient_checkpointing"));
  CHECK_THAT(
      file_error("off.yaml", "model: tiny\ngradient_checkpointing: false\ngradient_checkpointing_policy: full\n"),
      Contains("key 'gradient_checkpointing_policy'") && Contains("no effect without gradient_checkpointing"));
  CHECK_THAT(file_error("policy.yaml", "model: tiny\ngradient_checkpointing_policy: selective\n"),
             Contains("key 'gradient_checkpointing_policy'") && Contains("no effect without gradient_checkpointing"));
  const auto selective = load_sweep_config(write_yaml(
      "selective.yaml", "model: tiny\ngradient_checkpointing: true\ngradient_checkpointing_policy: selective\n"));
  CHECK(selective.run_recomputation() == "selective");
  CHECK(load_sweep_config("", cli(Command::kSweep, {"--model", "tiny", "--gradient-checkpointing",
                                                    "--gradient-checkpointing-policy", "every_n"}))
            .run_recomputation() == "every_2");
  // A key of another subcommand: refused, naming the ones that take it.
  CHECK_THAT(error_of([] {
               load_sweep_config("", cli(Command::kSweep, {"--model", "tiny", "--mfu", "0.5"}));
             }),
             Contains("command line: key 'mfu': not a key of kiln-profile sweep (kiln-profile plan takes it)"));
}

TEST_CASE("each subcommand's --help lists exactly the keys it reads", "[profile][config]") {
  for (const Command command : {Command::kSweep, Command::kPlan, Command::kExplain}) {
    INFO(kiln::profile::command_name(command));
    std::vector<std::string> names;
    for (const auto& doc : kiln::profile::command_keys(command)) {
      names.push_back(doc.name);
      CHECK_NOTHROW(kiln::profile::check_command_keys(command, {{doc.name, "1"}}));
    }
    // And nothing else: each other subcommand's key that is not also its own is refused.
    for (const Command other : {Command::kSweep, Command::kPlan, Command::kExplain}) {
      for (const auto& doc : kiln::profile::command_keys(other)) {
        if (std::find(names.begin(), names.end(), doc.name) != names.end()) continue;
        CHECK_THAT(error_of([&] {
                     kiln::profile::check_command_keys(command, {{doc.name, "1"}});
                   }),
                   Contains("not a key of kiln-profile"));
      }
    }
  }
}

TEST_CASE("plan's device: auto is the GPU device_memory names, else this machine's", "[profile][config][device]") {
  auto plan = [](const std::vector<std::string>& args) {
    std::vector<std::string> all = {"--model", "tiny", "--target-sequences", "8"};
    all.insert(all.end(), args.begin(), args.end());
    return kiln::profile::plan_config(kiln::profile::read_settings(Command::kPlan, "", cli(Command::kPlan, all)));
  };
  // A size: this machine's device (on a machine without a GPU the CPU: it was read as CUDA once).
  CHECK(plan({"--device-memory", "80GB"}).run.cuda == torch::cuda::is_available());
  CHECK(plan({"--device-memory", "80GB"}).device_memory_bytes == 80e9);
  // A GPU by name, or cuda: a GPU plan, with or without a GPU here (nothing runs).
  const auto named = plan({"--device-memory", "A100-80GB"});
  CHECK(named.run.cuda);
  CHECK(named.device_name == "A100-80GB");
  CHECK(plan({"--device-memory", "80GB", "--device", "cuda"}).run.cuda);
  CHECK_FALSE(plan({"--device-memory", "80GB", "--device", "cpu"}).run.cuda);
  CHECK_THAT(error_of([&] {
               plan({"--device-memory", "A100-80GB", "--device", "cpu"});
             }),
             Contains("key 'device_memory': 'A100-80GB' is a GPU but device is cpu"));
  CHECK_THAT(error_of([&] {
               plan({"--device-memory", "eighty"});
             }),
             Contains("command line: key 'device_memory': 'eighty' is not a size"));
  CHECK_THAT(error_of([&] {
               plan({"--device-memory", "80GB", "--device", "gpu"});
             }),
             Contains("command line: key 'device': 'gpu' is not auto, cpu or cuda"));
  if (!torch::cuda::is_available()) {
    CHECK_THAT(error_of([&] {
                 plan({"--device", "cuda"});
               }),
               Contains("key 'device_memory': missing") && Contains("no GPU here to ask"));
  }
}

TEST_CASE("explain's settings: required keys, one value each, the recomputation rule", "[profile][config]") {
  auto explain = [](const std::vector<std::string>& args) {
    return kiln::profile::read_settings(Command::kExplain, "", cli(Command::kExplain, args));
  };
  const auto s = explain({"--model", "tiny", "--cutoff-len", "64", "--batch-size", "2", "--json",
                          "--gradient-checkpointing", "--gradient-checkpointing-policy", "selective"});
  // kiln-pretrain's rule: a policy without gradient_checkpointing is a contradiction (kiln-profile
  // once implied the key; that drift is gone).
  CHECK_THAT(error_of([&] {
               explain({"--model", "tiny", "--cutoff-len", "64", "--batch-size", "2", "--gradient-checkpointing-policy",
                        "selective"});
             }),
             Contains("key 'gradient_checkpointing_policy'") && Contains("no effect without gradient_checkpointing"));
  CHECK(s.cutoff_len == std::vector<int64_t>{64});
  CHECK(s.per_device_train_batch_size == std::vector<int64_t>{2});
  CHECK(s.gradient_accumulation_steps == std::vector<int64_t>{1});
  CHECK(s.json);
  CHECK(s.run.gradient_checkpointing);
  CHECK_THAT(error_of([&] { explain({"--model", "tiny", "--batch-size", "2"}); }), Contains("key 'cutoff_len'"));
  CHECK_THAT(error_of([&] {
               explain({"--model", "tiny", "--cutoff-len", "64,128", "--batch-size", "2"});
             }),
             Contains("key 'cutoff_len': 2 values: explain models one"));
  CHECK_THAT(error_of([&] {
               explain({"--model", "tiny", "--cutoff-len", "64", "--batch-size", "2", "--gradient-checkpointing",
                        "--gradient-checkpointing-policy", "full", "--gradient-checkpointing-every", "4"});
             }),
             Contains("command line: key 'gradient_checkpointing_every'") &&
                 Contains("contradicts gradient_checkpointing_policy full"));
  // device_memory names a GPU; beside device cpu it is a contradiction.
  CHECK(kiln::profile::explain_device(
            explain({"--model", "tiny", "--cutoff-len", "64", "--batch-size", "2", "--device-memory", "H100-80GB"}))
            .cuda);
  CHECK_THAT(error_of([&] {
               kiln::profile::explain_device(explain({"--model", "tiny", "--cutoff-len", "64", "--batch-size", "2",
                                                      "--device-memory", "H100-80GB", "--device", "cpu"}));
             }),
             Contains("key 'device_memory'") && Contains("give one of the two"));
}

TEST_CASE("the grid's recomputation list: names of train/recomputation.h, one point each", "[profile][config]") {
  const auto s = load_sweep_config("", cli(Command::kSweep, {"--model", "tiny", "--cutoff-len", "16,32",
                                                             "--recomputation", "none,every_2,selective"}));
  const auto points = kiln::profile::grid_points(s);
  REQUIRE(points.size() == 6);
  CHECK(points[0].recomputation == "none");
  CHECK(points[2].recomputation == "selective");
  CHECK(points[3].cutoff_len == 32);
  CHECK(kiln::profile::point_label(points[1]) ==
        "cutoff_len 16, batch 1, gradient_accumulation_steps 1, recomputation every_2");
  // Each point's run asks for its recomputation through kiln-pretrain's three keys.
  for (const auto& p : points) {
    const kiln::train::PretrainConfig run = kiln::profile::point_config(s, p);
    CHECK(kiln::train::resolve_recomputation(run.gradient_checkpointing, run.gradient_checkpointing_policy,
                                             run.gradient_checkpointing_every)
              .name() == p.recomputation);
  }
  // Without the list, one point per shape, the keys deciding.
  CHECK(kiln::profile::grid_points(load_sweep_config("", cli(Command::kSweep, {"--model", "tiny"})))[0]
            .recomputation.empty());
  CHECK_THAT(error_of([] {
               load_sweep_config("", cli(Command::kSweep, {"--model", "tiny", "--recomputation", "every_1"}));
             }),
             Contains("key 'recomputation': 'every_1' is not none, full, selective or every_<n> with n >= 2"));
  CHECK_THAT(error_of([] {
               load_sweep_config("", cli(Command::kSweep,
                                         {"--model", "tiny", "--recomputation", "full", "--gradient-checkpointing"}));
             }),
             Contains("key 'recomputation'") && Contains("leave gradient_checkpointing and its keys out"));
}
