// Pretraining config: LLaMA-Factory key names load, command-line overrides win, and every bad
// input names its source and key. Reference: the error contract (file/command line, key, value).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/common/log.h"
#include "kiln/model/presets.h"
#include "kiln/train/hf/lf_keys.h"
#include "kiln/train/hf/run_outputs.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/recomputation.h"
#include "kiln/train/trainer.h"
#include "kiln/train/training_stack.h"
#include "support.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using kiln::test::error_of;
using kiln::train::load_pretrain_config;
using kiln::train::parse_overrides;

namespace {
std::string write_yaml(const std::string& name, const std::string& text) {
  static const auto dir = kiln::test::scratch_dir("pretrain_config");
  const auto path = dir / name;
  std::ofstream(path) << text;
  return path.string();
}
// The keys of the user's LLaMA-Factory runs (configs/reference/llamafactory_runs.yaml).
const char* kLlamaFactory = R"(
model: llama-100m
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
cutoff_len: 1024
)";
}  // namespace

TEST_CASE("a LLaMA-Factory style config loads", "[train][config]") {
  const auto c = load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory));
  CHECK(c.per_device_train_batch_size == 1);
  CHECK(c.gradient_accumulation_steps == 8);
  CHECK(c.learning_rate == 1e-4);
  CHECK(c.lr_scheduler_type == "cosine");
  CHECK(c.warmup_ratio == 0.1);
  CHECK(c.bf16);
  CHECK(c.cutoff_len == 1024);
  CHECK_FALSE(c.full_determinism);
}

TEST_CASE("command-line overrides win and are checked like the file", "[train][config]") {
  const std::string path = write_yaml("lf.yaml", kLlamaFactory);
  const auto c = load_pretrain_config(path, parse_overrides({"--learning_rate", "3e-4", "--cutoff_len=2048", "--bf16",
                                                             "false", "--full_determinism", "true"}));
  CHECK(c.learning_rate == 3e-4);
  CHECK(c.cutoff_len == 2048);
  CHECK(c.full_determinism);
  CHECK_FALSE(c.bf16);
  CHECK_THAT(error_of([&] {
               load_pretrain_config(path, parse_overrides({"--learning_rate", "fast"}));
             }),
             Contains("command line") && Contains("learning_rate") && Contains("'fast'"));
  CHECK_THAT(error_of([&] {
               load_pretrain_config(path, parse_overrides({"--lr", "1"}));
             }),
             Contains("command line") && Contains("'lr'") && Contains("unknown"));
  CHECK_THAT(error_of([] { parse_overrides({"--seed"}); }), Contains("seed") && Contains("missing value"));
  // A model named on the command line replaces the file's, whichever key either used.
  const auto hf = load_pretrain_config(path, {{"model_name_or_path", "/models/x"}});
  CHECK(hf.model.empty());
  CHECK(hf.model_name_or_path == "/models/x");
  CHECK(hf.source == path + " + command line");
  CHECK(load_pretrain_config("quickstart").source == "preset 'quickstart'");
  CHECK_THAT(error_of([] { parse_overrides({"stray"}); }), Contains("'stray'"));
  // A key given twice, in either spelling: the last wins (argparse's rule), so a wrapper can
  // append overrides to a base command line.
  const auto twice = parse_overrides({"--seed", "1", "--cutoff_len", "64", "--seed=2"});
  CHECK(twice.size() == 3);
  CHECK(load_pretrain_config(path, twice).seed == 2);
}

TEST_CASE("training_args.json holds the keys the LLaMA-Factory table acts on too", "[train][config]") {
  const auto c = load_pretrain_config("quickstart", parse_overrides({"--report_to", "tensorboard", "--seed", "9"}));
  const auto j = nlohmann::json::parse(kiln::train::pretrain_config_json(c));
  CHECK(j.at("report_to") == "tensorboard");
  CHECK(j.at("seed") == 9);
  for (const auto& key : kiln::train::pretrain_config_keys()) CHECK(j.contains(key));
}

TEST_CASE("lr_scheduler_kwargs: a mapping or a JSON string, each key checked", "[train][config][schedule]") {
  // kLlamaFactory says lr_scheduler_type: cosine.
  const std::string path =
      write_yaml("kwargs.yaml", std::string(kLlamaFactory) + "lr_scheduler_kwargs: {num_cycles: 2}\n");
  CHECK(load_pretrain_config(path).lr_scheduler_kwargs.numbers.at("num_cycles") == 2.0);
  const auto cli =
      load_pretrain_config(path, {{"lr_scheduler_type", "warmup_stable_decay"},
                                  {"lr_scheduler_kwargs", R"({"num_decay_steps": 5, "decay_type": "1-sqrt"})"}});
  CHECK(cli.lr_scheduler_kwargs.numbers == std::map<std::string, double>{{"num_decay_steps", 5.0}});  // replaced
  CHECK(cli.lr_scheduler_kwargs.strings.at("decay_type") == "1-sqrt");
  const std::string json =
      write_yaml("json.yaml", std::string(kLlamaFactory) + "lr_scheduler_kwargs: '{\"num_cycles\": 0.75}'\n");
  CHECK(load_pretrain_config(json).lr_scheduler_kwargs.numbers.at("num_cycles") == 0.75);
  auto err = [](const std::string& extra, const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
    const std::string path = write_yaml("bad_kwargs.yaml", std::string(kLlamaFactory) + extra);
    return error_of([&] { load_pretrain_config(path, overrides); });
  };
  // A key of no schedule, a key of another schedule, a value of the wrong type: each named.
  CHECK_THAT(err("lr_scheduler_kwargs: {num_cycle: 2}\n"),
             Contains("bad_kwargs.yaml") && Contains("lr_scheduler_kwargs.num_cycle") && Contains("unknown"));
  CHECK_THAT(err("lr_scheduler_kwargs: {lr_end: 1.0e-7}\n"),
             Contains("lr_scheduler_kwargs.lr_end") && Contains("cosine") && Contains("num_cycles"));
  CHECK_THAT(err("lr_scheduler_kwargs: {num_cycles: many}\n"),
             Contains("lr_scheduler_kwargs.num_cycles") && Contains("many"));
  CHECK_THAT(err("lr_scheduler_kwargs: {num_decay_steps: 2.5}\n", {{"lr_scheduler_type", "warmup_stable_decay"}}),
             Contains("lr_scheduler_kwargs.num_decay_steps") && Contains("2.5"));
  CHECK_THAT(err("lr_scheduler_kwargs: [1, 2]\n"), Contains("lr_scheduler_kwargs") && Contains("mapping"));
  CHECK_THAT(err("", {{"lr_scheduler_kwargs", R"({"num_cycles": 2})"}, {"lr_scheduler_type", "constant"}}),
             Contains("command line") && Contains("lr_scheduler_kwargs.num_cycles") && Contains("constant"));
  // Types: HF's that follow the step, not reduce_lr_on_plateau; HF's own refusals.
  CHECK_THAT(err("", {{"lr_scheduler_type", "reduce_lr_on_plateau"}}),
             Contains("lr_scheduler_type") && Contains("reduce_lr_on_plateau") && Contains("not supported"));
  CHECK_THAT(err("", {{"lr_scheduler_type", "cosine_with_min_lr"}}),
             Contains("lr_scheduler_kwargs") && Contains("min_lr_rate"));
  CHECK_THAT(err("lr_scheduler_kwargs: {lr_end: 1.0}\n", {{"lr_scheduler_type", "polynomial"}}),
             Contains("lr_scheduler_kwargs.lr_end") && Contains("smaller"));
  CHECK_THAT(err("decay_ratio: 0.2\nlr_scheduler_kwargs: {num_decay_steps: 10}\n",
                 {{"lr_scheduler_type", "warmup_stable_decay"}}),
             Contains("decay_ratio"));
  for (const std::string type : {"linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                                 "constant_with_warmup", "inverse_sqrt", "warmup_stable_decay"}) {
    CHECK_NOTHROW(load_pretrain_config(write_yaml("types.yaml", kLlamaFactory), {{"lr_scheduler_type", type}}));
  }
}

TEST_CASE("bad pretraining configs name the file and key", "[train][config]") {
  auto err = [](const std::string& extra) {
    const std::string path = write_yaml("bad.yaml", std::string(kLlamaFactory) + extra);
    return error_of([&] { load_pretrain_config(path); });
  };
  CHECK_THAT(err("learning_rat: 1\n"), Contains("bad.yaml") && Contains("'learning_rat'") && Contains("unknown"));
  CHECK_THAT(err("fp16: true\n"), Contains("bad.yaml") && Contains("fp16"));
  CHECK_THAT(err("save_steps: -3\n"), Contains("save_steps") && Contains("-3"));
  CHECK_THAT(err("warmup_ratio: 1.5\n"), Contains("warmup_ratio") && Contains("more than once"));
  CHECK_THAT(err("min_lr_ratio: 1.5\n"), Contains("min_lr_ratio") && Contains("1.5"));
  CHECK_THAT(err("optim: sgd\n"), Contains("'optim'") && Contains("'sgd' is not supported") && Contains("adamw_torch"));
  CHECK_THAT(error_of([] {
               load_pretrain_config("", {{"model", "tiny"}, {"lr_scheduler_type", "cosine_restarts"}});
             }),
             Contains("lr_scheduler_type") && Contains("cosine_restarts"));
  CHECK_THAT(err("model_name_or_path: /some/dir\n"), Contains("model"));
  CHECK_THAT(err("adam_beta2: [1, 2]\n"), Contains("adam_beta2") && Contains("list"));
  CHECK_THAT(error_of([] { load_pretrain_config("/no/such/config.yaml"); }), Contains("/no/such/config.yaml"));
}

TEST_CASE("every documented key is accepted", "[train][config]") {
  for (const auto& key : kiln::train::pretrain_config_keys()) {
    CAPTURE(key);
    const std::string msg = error_of([&] {
      load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{key, "not-a-valid-value?"}});
    });
    CHECK_THAT(msg, !Contains("unknown key"));
  }
}

TEST_CASE("ZeRO stage from zero_stage or LLaMA-Factory's DeepSpeed JSON; stage 3 and offload refused",
          "[train][config]") {
  const auto ds = [](const std::string& name, const std::string& json) { return write_yaml(name, json); };
  const std::string z2 = ds("ds_z2_config.json", R"({"train_batch_size": "auto", "zero_optimization": {"stage": 2,
      "allgather_partitions": true, "overlap_comm": true, "contiguous_gradients": true}})");
  const std::string z0 = ds("ds_z0_config.json", R"({"zero_optimization": {"stage": 0}})");
  CHECK(load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{"deepspeed", z2}}).resolved_zero_stage() == 2);
  CHECK(load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{"deepspeed", z0}}).resolved_zero_stage() == 0);
  CHECK(load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{"zero_stage", "1"}}).resolved_zero_stage() == 1);
  auto err = [](const std::vector<std::pair<std::string, std::string>>& overrides) {
    return error_of([&] { load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), overrides); });
  };
  const std::string z3 = ds("ds_z3_config.json", R"({"zero_optimization": {"stage": 3}})");
  const std::string off =
      ds("ds_z2_offload_config.json", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  const std::string broken = ds("broken.json", R"({"zero_optimization": )");
  CHECK_THAT(err({{"deepspeed", z3}}),
             Contains("ds_z3_config.json") && Contains("zero_optimization.stage 3") && Contains("not supported yet"));
  CHECK_THAT(err({{"deepspeed", off}}), Contains("offload_optimizer.device 'cpu'") && Contains("not supported"));
  CHECK_THAT(err({{"deepspeed", broken}}), Contains("broken.json") && Contains("not JSON"));
  CHECK_THAT(err({{"deepspeed", "/no/such/ds.json"}}), Contains("deepspeed") && Contains("cannot open"));
  CHECK_THAT(err({{"deepspeed", z2}, {"zero_stage", "1"}}), Contains("zero_stage") && Contains("says stage 2"));
  CHECK_THAT(err({{"zero_stage", "3"}}), Contains("zero_stage") && Contains("not supported yet"));
  CHECK_THAT(err({{"zero_stage", "7"}}), Contains("zero_stage") && Contains("7"));
  CHECK_THAT(err({{"ddp_timeout", "0"}}), Contains("ddp_timeout"));
}

TEST_CASE("recomputation keys: one rule for kiln-pretrain and kiln-profile, no key silently ignored",
          "[train][config]") {
  using kiln::train::resolve_recomputation;
  // The rule itself (train/recomputation.h), every combination of the three settings.
  auto name = [](bool on, const std::string& policy, int64_t every) {
    return resolve_recomputation(on, policy, every).name();
  };
  CHECK(name(false, "", 0) == "none");
  CHECK(name(true, "", 0) == "full");
  CHECK(name(true, "", 1) == "full");
  CHECK(name(true, "", 4) == "every_4");
  CHECK(name(true, "full", 0) == "full");
  CHECK(name(true, "full", 1) == "full");
  CHECK(name(true, "every_n", 0) == "every_2");
  CHECK(name(true, "every_n", 3) == "every_3");
  CHECK(name(true, "selective", 0) == "selective");
  CHECK(resolve_recomputation(true, "every_n", 3).every == 3);
  CHECK(resolve_recomputation(true, "full", 0).every == 1);
  CHECK(resolve_recomputation(true, "selective", 1).every == 0);
  for (const auto& [on, policy, every, key] : std::vector<std::tuple<bool, std::string, int64_t, std::string>>{
           {true, "full", 4, "gradient_checkpointing_every"},
           {true, "selective", 2, "gradient_checkpointing_every"},
           {true, "every_n", 1, "gradient_checkpointing_every"},
           {true, "every_n", -1, "gradient_checkpointing_every"},
           {true, "sometimes", 0, "gradient_checkpointing_policy"},
           {false, "selective", 0, "gradient_checkpointing_policy"},
           {false, "", 4, "gradient_checkpointing_every"}}) {
    CAPTURE(on, policy, every);
    const auto problem = kiln::train::recomputation_problem(on, policy, every);
    REQUIRE(problem);
    CHECK(problem->first == key);
    CHECK_THROWS_AS(resolve_recomputation(on, policy, every), std::invalid_argument);
  }
  // Through a YAML: the stride alone is every_n (it used to be ignored under the default full),
  // and a contradiction names the file and the key.
  auto config = [](const std::string& extra) {
    return load_pretrain_config(write_yaml("rc.yaml", "model: tiny\n" + extra));
  };
  CHECK(config("gradient_checkpointing: true\ngradient_checkpointing_every: 4\n").checkpoint_every() == 4);
  CHECK(config("gradient_checkpointing: true\ngradient_checkpointing_policy: every_n\n").checkpoint_every() == 2);
  CHECK(config("gradient_checkpointing: true\n").checkpoint_every() == 1);
  CHECK(config("").checkpoint_every() == 0);
  const auto selective = config("gradient_checkpointing: true\ngradient_checkpointing_policy: selective\n");
  CHECK(selective.selective_recomputation());
  CHECK(selective.checkpoint_every() == 0);
  CHECK_THAT(error_of([&] {
               config(
                   "gradient_checkpointing: true\ngradient_checkpointing_policy: full\n"
                   "gradient_checkpointing_every: 4\n");
             }),
             Contains("rc.yaml") && Contains("gradient_checkpointing_every") && Contains("every_n"));
  CHECK_THAT(error_of([&] { config("gradient_checkpointing_policy: selective\n"); }),
             Contains("rc.yaml") && Contains("gradient_checkpointing_policy") && Contains("no effect"));
}

TEST_CASE("keys a config sets without effect are named, the others are not", "[train][config]") {
  using kiln::train::keys_without_effect;
  auto notes = [](const std::string& yaml, std::set<std::string> given) {
    const auto c = kiln::train::pretrain_config_from_yaml_text("model: tiny\n" + yaml, "n.yaml");
    return keys_without_effect(c, given);
  };
  auto names = [](const std::vector<std::string>& lines) {
    std::set<std::string> keys;
    for (const auto& line : lines) keys.insert(line.substr(0, line.find(':')));
    return keys;
  };
  // A shard folder (no dataset:): LLaMA-Factory's data keys do nothing.
  CHECK(names(notes("max_samples: 10\npacking: true\npreprocessing_batch_size: 4\n",
                    {"max_samples", "packing", "preprocessing_batch_size"})) ==
        std::set<std::string>{"max_samples", "packing", "preprocessing_batch_size"});
  CHECK(names(notes("tokenized_path: /tmp/x\ndataset_dir: /tmp/y\n", {"tokenized_path", "dataset_dir"})) ==
        std::set<std::string>{"dataset_dir"});
  // Keys of a feature that is off, of another schedule, and warmup_ratio beside warmup_steps.
  CHECK(names(notes("auto_fit_memory: 80GB\nlogging_dir: /tmp/tb\n", {"auto_fit_memory", "logging_dir"})) ==
        std::set<std::string>{"auto_fit_memory", "logging_dir"});
  CHECK(names(notes("lr_scheduler_type: linear\nmin_lr_ratio: 0.1\ndecay_ratio: 0.2\n",
                    {"lr_scheduler_type", "min_lr_ratio", "decay_ratio"})) ==
        std::set<std::string>{"min_lr_ratio", "decay_ratio"});
  CHECK(names(notes("lr_scheduler_type: constant\nwarmup_steps: 5\n", {"lr_scheduler_type", "warmup_steps"})) ==
        std::set<std::string>{"warmup_steps"});
  // transformers 5.6 (training_args.py:1511-1513): a written warmup_ratio replaces warmup_steps.
  const auto both = notes("warmup_steps: 5\nwarmup_ratio: 0.1\n", {"warmup_steps", "warmup_ratio"});
  REQUIRE(both.size() == 1);
  CHECK_THAT(both[0], StartsWith("warmup_steps:") && Contains("warmup_ratio 0.1 replaces it"));
  // HF's evaluation rules (a config with dataset, do_eval or eval_strategy): eval_steps needs
  // eval_strategy steps, and val_size without any evaluation holds out examples for nothing.
  CHECK(names(notes("do_eval: false\neval_steps: 10\nval_size: 0.1\n", {"do_eval", "eval_steps", "val_size"})) ==
        std::set<std::string>{"eval_steps", "val_size"});
  CHECK(names(notes("do_eval: true\neval_steps: 10\nval_size: 0.1\n", {"do_eval", "eval_steps", "val_size"})) ==
        std::set<std::string>{"eval_steps"});
  CHECK(notes("eval_strategy: steps\neval_steps: 10\nval_size: 0.1\n", {"eval_strategy", "eval_steps", "val_size"})
            .empty());
  CHECK(notes("eval_steps: 10\nval_size: 0.1\n", {"eval_steps", "val_size"}).empty());  // kiln's own rules
  // Where each key acts, nothing is said; a key at its default that the config did not set neither.
  CHECK(notes("lr_scheduler_type: cosine\nmin_lr_ratio: 0.1\nwarmup_ratio: 0.1\nreport_to: tensorboard\n"
              "logging_dir: /tmp/tb\nauto_fit: true\nauto_fit_memory: 80GB\n",
              {"lr_scheduler_type", "min_lr_ratio", "warmup_ratio", "report_to", "logging_dir", "auto_fit",
               "auto_fit_memory"})
            .empty());
  CHECK(notes("", {}).empty());
  // streaming's keys without it; with it, the map's num_proc and the sampler's seed do nothing.
  CHECK(names(notes("buffer_size: 64\ndataloader_num_workers: 4\n", {"buffer_size", "dataloader_num_workers"})) ==
        std::set<std::string>{"buffer_size", "dataloader_num_workers"});
  const auto streamed = kiln::train::pretrain_config_from_yaml_text(
      "model: tiny\ndataset: a\nstreaming: true\nmax_steps: 5\ndataloader_num_workers: 2\nbuffer_size: 64\n"
      "preprocessing_num_workers: 4\ndata_seed: 3\n",
      "n.yaml");
  CHECK(names(keys_without_effect(streamed, {"streaming", "max_steps", "dataloader_num_workers", "buffer_size",
                                             "preprocessing_num_workers", "data_seed"})) ==
        std::set<std::string>{"preprocessing_num_workers", "data_seed"});
  // No preset kiln ships sets a key without effect.
  for (const auto& [name, text] : kiln::model::detail::embedded_pretrain_configs()) {
    CAPTURE(name);
    std::set<std::string> given;
    for (const auto& kv : YAML::Load(std::string(text))) given.insert(kv.first.as<std::string>());
    CHECK(keys_without_effect(load_pretrain_config(std::string(name)), given).empty());
  }
}

// ---- Issue #53, item 7: LLaMA-Factory's and transformers 5.6's rules at the config level ----

namespace {
// transformers 5.6, TrainingArguments.get_warmup_steps (training_args.py:2111-2113) and
// TrainerState.compute_steps (trainer_callback.py:164-166): `int(w) if w >= 1 else
// math.ceil(total * w)`, written out again here as the reference.
int64_t hf_steps(double w, int64_t total) {
  return w >= 1 ? static_cast<int64_t>(w) : static_cast<int64_t>(std::ceil(static_cast<double>(total) * w));
}
const char* kLfDataset = "model: tiny\nstage: pt\ndataset: c4_demo\n";

// Collects the log's records while it lives (kiln::set_log_handler), then restores the default.
struct LogLines {
  std::vector<std::string> lines;
  LogLines() {
    kiln::set_log_handler([this](kiln::LogLevel, std::string_view m) { lines.emplace_back(m); });
  }
  ~LogLines() { kiln::set_log_handler({}); }
  std::string joined() const {
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }
};
}  // namespace

TEST_CASE("warmup: a written warmup_ratio replaces warmup_steps, and warmup_steps below 1 is a ratio",
          "[train][config]") {
  using kiln::train::pretrain_config_from_yaml_text;
  using kiln::train::schedule_of;
  auto warmup = [](const std::string& yaml, int64_t total) {
    return schedule_of(pretrain_config_from_yaml_text("model: tiny\n" + yaml, "w.yaml"), total).warmup_steps;
  };
  // training_args.py:1511-1513: `if self.warmup_ratio is not None: self.warmup_steps = self.warmup_ratio`.
  CHECK(warmup("warmup_steps: 100\nwarmup_ratio: 0.1\n", 333) == hf_steps(0.1, 333));  // 34, not 100
  CHECK(warmup("warmup_steps: 100\nwarmup_ratio: 0\n", 333) == hf_steps(0.0, 333));    // a written 0 too
  CHECK(warmup("warmup_steps: 100\n", 333) == 100);
  CHECK(warmup("warmup_steps: 0.05\n", 333) == hf_steps(0.05, 333));  // ceil(16.65) = 17
  CHECK(warmup("warmup_steps: 2.5\n", 333) == hf_steps(2.5, 333));    // int(2.5) = 2
  CHECK(warmup("warmup_steps: 1.0\n", 333) == 1);
  CHECK(warmup("warmup_ratio: 0.1\n", 309852) == 30986);  // the reference run's
  // The file's ratio beats the command line's steps: LLaMA-Factory merges both into one set of
  // arguments before HF's __post_init__ runs.
  const std::string path = write_yaml("warmup.yaml", "model: tiny\nwarmup_ratio: 0.1\n");
  const auto c = load_pretrain_config(path, {{"warmup_steps", "50"}});
  CHECK(c.hf_warmup_steps() == 0.1);
  CHECK(schedule_of(c, 333).warmup_steps == hf_steps(0.1, 333));
  CHECK_THAT(error_of([] { pretrain_config_from_yaml_text("model: tiny\nwarmup_steps: -1\n", "w.yaml"); }),
             Contains("w.yaml") && Contains("warmup_steps") && Contains("-1"));
}

TEST_CASE("fractional logging_steps, save_steps and eval_steps resolve against the run's steps as HF's",
          "[train][config]") {
  using kiln::train::pretrain_config_from_yaml_text;
  using kiln::train::resolve_steps;
  for (const auto& [value, total] : std::vector<std::pair<double, int64_t>>{
           {0.1, 333}, {0.25, 10}, {0.5, 3}, {0.001, 10}, {0.999, 7}, {1.0, 50}, {20.0, 50}, {0.0, 50}}) {
    CAPTURE(value, total);
    CHECK(resolve_steps(value, total) == hf_steps(value, total));
  }
  const auto c =
      pretrain_config_from_yaml_text("model: tiny\nlogging_steps: 0.25\nsave_steps: 0.5\neval_steps: 0.1\n", "f.yaml");
  CHECK(c.logging_steps == 0.25);
  // kiln's own config evaluates every eval_steps; under HF's rules eval_steps falls back to logging_steps.
  CHECK(kiln::train::eval_schedule(c, 333).every == hf_steps(0.1, 333));
  const auto hf = pretrain_config_from_yaml_text("model: tiny\nlogging_steps: 0.25\neval_strategy: steps\n", "f.yaml");
  CHECK(kiln::train::eval_schedule(hf, 333).every == hf_steps(0.25, 333));
  // training_args.json: whole numbers as integers (HF's ints), ratios as floats.
  const auto j = nlohmann::json::parse(kiln::train::pretrain_config_json(c));
  CHECK(j.at("logging_steps") == 0.25);
  CHECK(j.at("save_total_limit").is_number_integer());
  CHECK(nlohmann::json::parse(kiln::train::pretrain_config_json(load_pretrain_config("quickstart")))
            .at("save_steps")
            .is_number_integer());
  // training_args.py:1691-1702: above 1 a whole number, in HF's words; eval_steps only where it is used.
  auto err = [](const std::string& yaml) {
    return error_of([&] { pretrain_config_from_yaml_text("model: tiny\n" + yaml, "f.yaml"); });
  };
  CHECK_THAT(err("save_steps: 2.5\n"),
             Contains("f.yaml") && Contains("save_steps") && Contains("must be an integer if bigger than 1: 2.5"));
  CHECK_THAT(err("logging_steps: 10.5\n"), Contains("logging_steps") && Contains("integer if bigger than 1"));
  CHECK_THAT(err("logging_steps: 0\n"), Contains("logging_steps"));
  CHECK_THAT(err("eval_strategy: steps\neval_steps: 3.5\n"), Contains("eval_steps") && Contains("integer"));
  CHECK_NOTHROW(pretrain_config_from_yaml_text("model: tiny\neval_strategy: 'no'\neval_steps: 3.5\n", "f.yaml"));
}

TEST_CASE("a run with fractional step intervals logs, evaluates and saves at HF's steps", "[train][config]") {
  kiln::train::PretrainConfig c;
  c.model = "tiny";
  c.cutoff_len = 32;
  c.per_device_train_batch_size = 2;
  c.max_steps = 10;
  c.device = "cpu";
  c.logging_steps = 0.25;  // ceil(2.5) = 3
  c.save_steps = 0.5;      // 5
  c.eval_steps = 0.35;     // ceil(3.5) = 4
  c.output_dir = kiln::test::scratch_dir("fractional_steps").string();
  kiln::train::Trainer trainer(c);
  trainer.train();
  const std::filesystem::path out(c.output_dir);
  const auto state = nlohmann::json::parse(std::ifstream(out / "trainer_state.json"));
  CHECK(state.at("logging_steps") == hf_steps(0.25, 10));
  CHECK(state.at("save_steps") == hf_steps(0.5, 10));
  CHECK(state.at("eval_steps") == hf_steps(0.35, 10));
  std::set<int64_t> logged, evaluated;
  for (const auto& e : state.at("log_history")) {
    if (e.contains("loss")) logged.insert(e.at("step").get<int64_t>());
    if (e.contains("eval_loss")) evaluated.insert(e.at("step").get<int64_t>());
  }
  CHECK(logged == std::set<int64_t>{3, 6, 9, 10});  // and the last step's window (kiln, docs/training.md)
  CHECK(evaluated == std::set<int64_t>{4, 8, 10});
  CHECK(std::filesystem::exists(out / "checkpoint-5"));
  CHECK(std::filesystem::exists(out / "checkpoint-10"));
  CHECK_FALSE(std::filesystem::exists(out / "checkpoint-3"));
}

TEST_CASE("evaluation asked for without evaluation data is LLaMA-Factory's error", "[train][config]") {
  using kiln::train::pretrain_config_from_yaml_text;
  // hparams/parser.py:362-365: (do_eval or ...) and eval_dataset is None and val_size < 1e-6.
  const std::string words = "Please make sure eval_dataset be provided or val_size >1e-6";
  auto err = [](const std::string& yaml) {
    return error_of([&] { pretrain_config_from_yaml_text(kLfDataset + yaml, "lf_eval.yaml"); });
  };
  CHECK_THAT(err("eval_strategy: steps\n"), Contains("lf_eval.yaml") && Contains("'eval_strategy'") && Contains(words));
  CHECK_THAT(err("do_eval: true\n"), Contains("lf_eval.yaml") && Contains("'do_eval'") && Contains(words));
  // HF turns do_eval on for eval_strategy steps (training_args.py:1537-1538), a written false too.
  CHECK_THAT(err("do_eval: false\neval_strategy: steps\n"), Contains(words));
  CHECK_THAT(err("do_eval: true\nval_size: 0.0000001\n"), Contains(words));
  CHECK_NOTHROW(pretrain_config_from_yaml_text(std::string(kLfDataset) + "eval_strategy: steps\nval_size: 0.1\n", "x"));
  CHECK_NOTHROW(pretrain_config_from_yaml_text(std::string(kLfDataset) + "do_eval: false\n", "x"));
  // kiln's own configs (shard folders with a val split) are checked when the data is open.
  CHECK_NOTHROW(pretrain_config_from_yaml_text("model: tiny\ndo_eval: true\n", "x"));
}

TEST_CASE("an LLaMA-Factory YAML recomputes by default, as LLaMA-Factory, and says why", "[train][config]") {
  // model/model_utils/checkpointing.py:164: on unless disable_gradient_checkpointing; transformers'
  // trainer.py:1378: gradient_checkpointing: true turns it on as well.
  auto on = [](const std::string& yaml) {
    return kiln::train::pretrain_config_from_yaml_text(yaml, "gc.yaml").gradient_checkpointing;
  };
  const std::string lf = kLfDataset;
  CHECK(on(lf));
  CHECK(on(lf + "disable_gradient_checkpointing: false\n"));
  CHECK(on(lf + "gradient_checkpointing: false\n"));  // LLaMA-Factory still recomputes
  CHECK_FALSE(on(lf + "disable_gradient_checkpointing: true\n"));
  CHECK(on(lf + "disable_gradient_checkpointing: true\ngradient_checkpointing: true\n"));
  CHECK_FALSE(on("model: tiny\n"));  // kiln's own config: gradient_checkpointing alone
  CHECK(on("model: tiny\ngradient_checkpointing: true\n"));
  CHECK(on("model: tiny\ndisable_gradient_checkpointing: false\n"));  // LLaMA-Factory's key, its rule
  CHECK(on(lf + "gradient_checkpointing_policy: selective\n"));
  const auto policy = kiln::train::pretrain_config_from_yaml_text(
      lf + "gradient_checkpointing_policy: every_n\ngradient_checkpointing_every: 3\n", "gc.yaml");
  CHECK(policy.checkpoint_every() == 3);
  // The start-up log says it once, with the reason; a YAML that turns it on itself gets no line.
  LogLines log;
  const std::string path = write_yaml("gc.yaml", lf + "val_size: 0.1\n");
  CHECK(load_pretrain_config(path).gradient_checkpointing);
  CHECK_THAT(log.joined(), Contains("gc.yaml") && Contains("gradient checkpointing on") &&
                               Contains("LLaMA-Factory's default") && Contains("disable_gradient_checkpointing: true"));
  log.lines.clear();
  load_pretrain_config(write_yaml("gc_on.yaml", lf + "gradient_checkpointing: true\n"));
  CHECK_THAT(log.joined(), !Contains("gradient checkpointing on"));
  const auto j = nlohmann::json::parse(kiln::train::pretrain_config_json(
      kiln::train::pretrain_config_from_yaml_text(lf + "disable_gradient_checkpointing: true\n", "gc.yaml")));
  CHECK(j.at("disable_gradient_checkpointing") == true);
  CHECK(j.at("gradient_checkpointing") == false);
}

TEST_CASE("neat_packing at stage pt: kiln's extension, with a line saying LLaMA-Factory refuses it",
          "[train][config]") {
  LogLines log;
  const auto c = load_pretrain_config(write_yaml("neat.yaml", std::string(kLfDataset) + "neat_packing: true\n"));
  CHECK(c.neat_packing);
  // hparams/parser.py:320-321, quoted.
  CHECK_THAT(log.joined(), Contains("neat.yaml") && Contains("neat_packing") &&
                               Contains("`neat_packing` cannot be set as True except SFT."));
}

TEST_CASE("LLaMA-Factory's other fields: inert defaults accepted, other values refused, tools' settings noted",
          "[train][config]") {
  using kiln::train::classify_lf_key;
  using kiln::train::LfKeyClass;
  // At LLaMA-Factory's default (inert for a full pt run) silently; elsewhere refused, naming kiln's way.
  for (const auto& [key, inert, other, says] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"lora_rank", "8", "16", "finetuning_type: full"},
           {"label_smoothing_factor", "0.0", "0.1", "cross-entropy"},
           {"loraplus_lr_embedding", "1.0e-6", "1e-5", "finetuning_type: full"},
           {"use_galore", "false", "true", "AdamW"},
           {"train_on_prompt", "false", "true", "cannot be set as True except SFT"},
           {"predict_with_generate", "false", "true", "cannot be set as True except SFT"},
           {"infer_backend", "huggingface", "vllm", "only available for API, CLI and Web"},
           {"tf32", "false", "true", "TF32"},
           {"fsdp", "", "full_shard", "FSDP"},
           {"metric_for_best_model", "__never__", "eval_loss", "save_total_limit"}}) {
    CAPTURE(key);
    if (inert != "__never__") {
      const auto ok = classify_lf_key(key, inert);
      CHECK(ok->cls == LfKeyClass::kNoEffect);
      CHECK(ok->message.empty());
    }
    const auto no = classify_lf_key(key, other);
    CHECK(no->cls == LfKeyClass::kRefused);
    CHECK_THAT(no->message, Contains(other) && Contains(says));
  }
  // Another program's settings: any value, with the line that says why.
  for (const std::string key : {"temperature", "top_p", "vllm_maxlen", "export_dir", "image_max_pixels",
                                "enable_torch_profiler", "log_level", "hub_token", "optim_args"}) {
    CAPTURE(key);
    const auto v = classify_lf_key(key, "0.3");
    CHECK(v->cls == LfKeyClass::kNoEffect);
    CHECK_FALSE(v->message.empty());
  }
  // use_cpu acts: the device.
  CHECK(kiln::train::pretrain_config_from_yaml_text("model: tiny\nuse_cpu: true\n", "u.yaml").device == "cpu");
  CHECK(kiln::train::pretrain_config_from_yaml_text("model: tiny\nuse_cpu: false\n", "u.yaml").device == "auto");
  CHECK_THAT(error_of([] {
               kiln::train::pretrain_config_from_yaml_text("model: tiny\ndevice: cuda\nuse_cpu: true\n", "u.yaml");
             }),
             Contains("u.yaml") && Contains("use_cpu") && Contains("cuda"));
  // --list-keys' classes: every PretrainConfig key acted on, every table key in one of three classes.
  const auto classes = nlohmann::json::parse(kiln::train::key_classes_json());
  for (const auto& key : kiln::train::pretrain_config_keys()) CHECK(classes.at(key) == "acted");
  for (const auto& key : kiln::train::lf_keys()) {
    CAPTURE(key);
    const std::string cls = classes.at(key);
    CHECK((cls == "acted" || cls == "accepted" || cls == "refused"));
  }
  CHECK(classes.at("temperature") == "accepted");
  CHECK(classes.at("lora_rank") == "accepted");  // at its default
  CHECK(classes.at("quantization_bit") == "refused");
  CHECK(classes.at("disable_gradient_checkpointing") == "acted");
}
