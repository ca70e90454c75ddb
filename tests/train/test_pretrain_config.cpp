// Pretraining config: LLaMA-Factory key names load, command-line overrides win, and every bad
// input names its source and key. Reference: the error contract (file/command line, key, value).
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

#include "kiln/model/presets.h"
#include "kiln/train/hf/lf_keys.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/recomputation.h"
#include "support.h"

using Catch::Matchers::Contains;
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
  const auto both = notes("warmup_steps: 5\nwarmup_ratio: 0.1\n", {"warmup_steps", "warmup_ratio"});
  REQUIRE(both.size() == 1);
  CHECK_THAT(both[0], Contains("warmup_ratio") && Contains("warmup_steps 5 wins"));
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
  // No preset kiln ships sets a key without effect.
  for (const auto& [name, text] : kiln::model::detail::embedded_pretrain_configs()) {
    CAPTURE(name);
    std::set<std::string> given;
    for (const auto& kv : YAML::Load(std::string(text))) given.insert(kv.first.as<std::string>());
    CHECK(keys_without_effect(load_pretrain_config(std::string(name)), given).empty());
  }
}
