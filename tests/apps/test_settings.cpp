// The settings of kiln-eval, kiln-generate, kiln-hf, kiln-tokenize, kiln-bench and kiln-smoke
// (apps/settings.h), read as each program reads them: its command line split by
// config::parse_command_line with the program's spelling. Reference: config/key_table.h's rules
// (a YAML file and the command line give the same settings, the command line wins over the file,
// an unknown key is refused naming its source, a key repeated on the command line takes the last)
// and the flags the programs took before (cxxopts), which must keep their meaning.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "apps/settings.h"
#include "kiln/ops/dispatch.h"
#include "support.h"

using Catch::Matchers::Contains;
using kiln::config::parse_command_line;
using kiln::test::error_of;
namespace cli = kiln::cli;

namespace {

// A YAML file under the temporary folder, removed at the end of the test case.
struct YamlFile {
  explicit YamlFile(const std::string& text)
      : path((std::filesystem::temp_directory_path() /
              ("kiln_settings_" + std::to_string(reinterpret_cast<uintptr_t>(this)) + ".yaml"))
                 .string()) {
    std::ofstream(path) << text;
  }
  ~YamlFile() { std::filesystem::remove(path); }
  std::string path;
};

cli::EvalSettings eval(const std::vector<std::string>& args) {
  return cli::read_eval_settings(parse_command_line(args, cli::eval_spelling()));
}

cli::TokenizeSettings tokenize(const std::vector<std::string>& args) {
  return cli::read_tokenize_settings(parse_command_line(args, cli::tokenize_spelling()));
}

cli::HfSettings hf(const std::string& command, const std::vector<std::string>& args) {
  return cli::read_hf_settings(command, parse_command_line(args, cli::hf_spelling(command)));
}

cli::BenchSettings bench(const std::vector<std::string>& args) {
  return cli::read_bench_settings(parse_command_line(args, cli::bench_spelling()));
}

}  // namespace

TEST_CASE("kiln-eval: a YAML file and the command line give the same settings", "[config][apps]") {
  const YamlFile file(
      "model_name_or_path: ckpt\ndataset_dir: shards\nsplit: train\ncutoff_len: 32\nper_device_eval_batch_size: 4\n"
      "bf16: true\nadd_bos: false\ndevice: cpu\n");
  // The flags kiln-eval took before (cxxopts): kebab case, --model, --batch-size, switches, --no-add-bos.
  const auto old = eval({"--model", "ckpt", "--dataset-dir", "shards", "--split", "train", "--cutoff-len", "32",
                         "--batch-size", "4", "--bf16", "--no-add-bos", "--device", "cpu"});
  const auto snake =
      eval({"--model_name_or_path=ckpt", "--dataset_dir", "shards", "--split", "train", "--cutoff_len", "32",
            "--per_device_eval_batch_size", "4", "--bf16", "true", "--add_bos", "false", "--device", "cpu"});
  const auto yaml = eval({"--config", file.path});
  for (const auto* s : {&old, &snake, &yaml}) {
    CHECK(s->model_name_or_path == "ckpt");
    CHECK(s->dataset_dir == "shards");
    CHECK(s->split == "train");
    CHECK(s->cutoff_len == 32);
    CHECK(s->per_device_eval_batch_size == 4);
    CHECK(s->bf16);
    CHECK(s->add_bos == "false");
    CHECK(s->device == "cpu");
  }
  CHECK(cli::bos_rule(yaml.add_bos) == kiln::data::BosRule::kNone);
  // The command line wins over the file, key by key; the sources are remembered for later errors.
  const auto both = eval({"--config", file.path, "--cutoff-len", "64", "--add-bos"});
  CHECK(both.cutoff_len == 64);
  CHECK(both.add_bos == "true");
  CHECK(both.per_device_eval_batch_size == 4);
  CHECK(both.given.source("cutoff_len") == "command line");
  CHECK(both.given.source("split") == file.path);
  // Defaults: what kiln-eval's options defaulted to.
  const auto d = eval({"--model", "m", "--dataset-dir", "d"});
  CHECK(d.cutoff_len == 1024);
  CHECK(d.per_device_eval_batch_size == 8);
  CHECK(!d.bf16);
  CHECK(d.add_bos == "auto");
  CHECK(cli::bos_rule(d.add_bos) == kiln::data::BosRule::kAuto);
}

TEST_CASE("kiln-eval: unknown, repeated and bad keys", "[config][apps]") {
  const YamlFile file("model_name_or_path: ckpt\ndataset_dir: shards\ncutof_len: 32\n");
  CHECK_THAT(error_of([&] {
               eval({"--config", file.path});
             }),
             Contains(file.path + ": key 'cutof_len': unknown key") && Contains("kiln-eval --help"));
  CHECK_THAT(error_of([] {
               eval({"--model", "m", "--dataset-dir", "d", "--cutof-len", "3"});
             }),
             Contains("command line: key 'cutof_len': unknown key"));
  // Repeated on the command line: the last wins, --no-add-bos after --add-bos too (one key).
  CHECK(eval({"--model", "m", "--dataset-dir", "d", "--cutoff-len", "16", "--cutoff-len", "48"}).cutoff_len == 48);
  CHECK(eval({"--model", "m", "--dataset-dir", "d", "--add-bos", "--no-add-bos"}).add_bos == "false");
  CHECK(eval({"--model", "m", "--dataset-dir", "d", "--no-add-bos", "--add-bos"}).add_bos == "true");
  // A bad value names its source and key.
  CHECK_THAT(error_of([] {
               eval({"--model", "m", "--dataset-dir", "d", "--cutoff-len", "1"});
             }),
             Contains("command line: key 'cutoff_len': must be >= 2, got 1"));
  CHECK_THAT(error_of([] {
               eval({"--model", "m", "--dataset-dir", "d", "--add-bos", "maybe"});
             }),
             Contains("command line: key 'add_bos'") && Contains("'maybe'"));
  CHECK_THAT(error_of([] { eval({"--dataset-dir", "d"}); }), Contains("key 'model_name_or_path': missing"));
  const YamlFile bad("model_name_or_path: ckpt\ndataset_dir: shards\ndevice: tpu\n");
  CHECK_THAT(error_of([&] { eval({"--config", bad.path}); }), Contains(bad.path + ": key 'device'"));
  CHECK(parse_command_line({"--cutoff-len", "x", "-h"}, cli::eval_spelling()).help);
}

TEST_CASE("kiln-tokenize: --input adds up; the modes refuse each other's keys", "[config][apps]") {
  const YamlFile file("input: [a.txt, b.jsonl]\noutput_dir: out\nval_fraction: 0.25\nprogress: false\n");
  const auto yaml = tokenize({"--config", file.path});
  const auto repeated = tokenize(
      {"--input", "a.txt", "--input", "b.jsonl", "--output", "out", "--val-fraction", "0.25", "--no-progress"});
  const auto listed =
      tokenize({"--input", "a.txt,b.jsonl", "--output_dir=out", "--val_fraction", "0.25", "--progress", "false"});
  for (const auto* s : {&yaml, &repeated, &listed}) {
    CHECK(s->input == std::vector<std::string>{"a.txt", "b.jsonl"});
    CHECK(s->output_dir == "out");
    CHECK(s->val_fraction == 0.25);
    CHECK(!s->progress);
    CHECK(s->mode().empty());
  }
  // The command line's --input replaces the file's list (the command line wins).
  CHECK(tokenize({"--config", file.path, "--input", "c.txt"}).input == std::vector<std::string>{"c.txt"});
  // Another key repeated: the last wins.
  CHECK(tokenize({"--input", "a", "--output", "o", "--threads", "2", "--threads", "3"}).threads == 3);
  CHECK_THAT(error_of([] {
               tokenize({"--input", "a", "--output", "o", "--thread", "2"});
             }),
             Contains("command line: key 'thread': unknown key"));
  CHECK_THAT(error_of([] {
               tokenize({"--decode", "ids.jsonl", "--input", "a.txt"});
             }),
             Contains("command line: key 'input': does not apply to decode"));
  CHECK_THAT(error_of([] {
               tokenize({"--input", "a", "--output", "o", "--repeat", "3"});
             }),
             Contains("key 'repeat': does not apply to tokenizing"));
  CHECK_THAT(error_of([] {
               tokenize({"--default-corpus", "--decode", "ids.jsonl"});
             }),
             Contains("key 'decode': give default_corpus or decode, not both"));
  CHECK_THAT(error_of([] {
               tokenize({"--input", "a", "--output", "o", "--txt-unit", "page"});
             }),
             Contains("key 'txt_unit': must be file or line, got 'page'"));
  CHECK_THAT(error_of([] { tokenize({"--input", "a"}); }), Contains("key 'output_dir': missing"));
  CHECK(tokenize({"--bench", "--input", "a", "--repeat", "2"}).mode() == "bench");
}

TEST_CASE("kiln-hf: each command's keys, --model by command", "[config][apps]") {
  const YamlFile file(
      "model_name_or_path: ckpt\nbatch: b.safetensors\nout: o.safetensors\nfused_loss: true\n"
      "autocast: bf16\nkernels: aten\n");
  const auto yaml = hf("forward", {"--config", file.path});
  const auto flags = hf("forward", {"--model", "ckpt", "--batch", "b.safetensors", "--out", "o.safetensors",
                                    "--fused-loss", "--autocast", "bf16", "--kernels", "aten"});
  for (const auto* s : {&yaml, &flags}) {
    CHECK(s->model_name_or_path == "ckpt");
    CHECK(s->batch == "b.safetensors");
    CHECK(s->fused_loss);
    CHECK(!s->grads);
    CHECK(s->autocast == "bf16");
    CHECK(s->kernels == "aten");
  }
  CHECK(hf("forward", {"--model", "m"}).kernels == kiln::ops::kDefaultKernels);
  // init's --model is a preset: the key model, as kiln-pretrain's.
  const auto init = hf("init", {"--model", "tiny", "--out", "d", "--seed", "3"});
  CHECK(init.model == "tiny");
  CHECK(init.model_name_or_path.empty());
  CHECK(init.seed == 3);
  // train: --steps and --lr are max_steps and learning_rate; repeated, the last wins.
  const auto train =
      hf("train", {"--model", "m", "--batch", "b", "--out", "o", "--steps", "4", "--lr", "0.5", "--steps", "2"});
  CHECK(train.max_steps == 2);
  CHECK(train.learning_rate == 0.5);
  CHECK_THAT(error_of([] {
               hf("train", {"--model", "m", "--kernels", "aten"});
             }),
             Contains("command line: key 'kernels': does not apply to train"));
  // The first key (in sorted order, KeySources::keys) that inspect does not read.
  CHECK_THAT(error_of([&] {
               hf("inspect", {"--config", file.path});
             }),
             Contains(file.path + ": key 'autocast': does not apply to inspect"));
  CHECK_THAT(error_of([] {
               hf("forward", {"--model", "m", "--autocast", "fp32"});
             }),
             Contains("key 'autocast': must be bf16 or fp16, got 'fp32'"));
  // A misspelled flag is an unknown key, at the end of the line or before another key.
  CHECK_THAT(error_of([] {
               hf("forward", {"--model", "m", "--grad"});
             }),
             Contains("command line: key 'grad': unknown key") && Contains("kiln-hf forward --help"));
  CHECK_THAT(error_of([] { hf("forward", {"--grad", "--model", "m"}); }), Contains("key 'grad': unknown key"));
  CHECK_THAT(error_of([] { hf("inspect", {}).required("in"); }), Contains("key 'in': missing required key"));
  CHECK_THAT(error_of([] { hf("push", {}); }), Contains("unknown command 'push'"));
}

TEST_CASE("kiln-bench: sizes, lists, and keys of ops not run", "[config][apps]") {
  const YamlFile file("device: cpu\nops: [attention]\nseqlens: [64, 128]\nheads: 4\nkv_heads: 2\niters: 2\n");
  const auto yaml = bench({"--config", file.path});
  const auto flags = bench({"--device", "cpu", "--ops", "attention", "--seqlens", "64,128", "--heads", "4",
                            "--kv-heads", "2", "--iters", "2"});
  for (const auto* s : {&yaml, &flags}) {
    CHECK(s->ops == std::vector<std::string>{"attention"});
    CHECK(s->seqlens == std::vector<int64_t>{64, 128});
    CHECK(s->head_dims == std::vector<int64_t>{64, 128});
    CHECK(s->heads == 4);
    CHECK(s->kv_heads == 2);
    CHECK(s->iters == 2);
    CHECK(s->runs("attention"));
    CHECK(!s->runs("rmsnorm"));
  }
  CHECK(bench({}).ops == std::vector<std::string>{"rmsnorm", "swiglu", "rope", "linear_ce", "linear"});
  CHECK(bench({"--iters", "3", "--iters", "7"}).iters == 7);
  CHECK_THAT(error_of([] {
               bench({"--ops", "rmsnorm", "--seqlens", "128"});
             }),
             Contains("key 'seqlens': applies to ops attention"));
  CHECK_THAT(error_of([] {
               bench({"--ops", "attention", "--seqlens", "64,x"});
             }),
             Contains("command line: key 'seqlens'") && Contains("'x'"));
  CHECK_THAT(error_of([] { bench({"--ops", "rmsnorm,softmax"}); }), Contains("key 'ops': unknown op 'softmax'"));
  CHECK_THAT(error_of([] {
               bench({"--ops", "attention", "--heads", "4", "--kv-heads", "3"});
             }),
             Contains("key 'kv_heads': (3) must divide heads (4)"));
  CHECK_THAT(error_of([] { bench({"--tokens", "0"}); }), Contains("key 'tokens': must be positive, got 0"));
  // --iters 0 ran one iteration under cxxopts (max(1, iters)); now it is refused, from a file too.
  CHECK_THAT(error_of([] { bench({"--iters", "0"}); }), Contains("command line: key 'iters': must be positive, got 0"));
  const YamlFile zero("iters: 0\n");
  CHECK_THAT(error_of([&] {
               bench({"--config", zero.path});
             }),
             Contains(zero.path + ": key 'iters': must be positive"));
  CHECK(bench({"--config", zero.path, "--iters", "4"}).iters == 4);  // the command line wins before the check
  CHECK_THAT(error_of([] { bench({"--token", "8"}); }), Contains("command line: key 'token': unknown key"));
}

TEST_CASE("kiln-smoke and kiln-generate: the older flags as aliases", "[config][apps]") {
  const YamlFile file(
      "max_steps: 5\nper_device_train_batch_size: 2\ncutoff_len: 16\nlearning_rate: 0.01\ndtype: bf16\n");
  const auto smoke = cli::read_smoke_settings(
      parse_command_line({"--steps", "5", "--batch-size", "2", "--seq-len", "16", "--lr", "0.01", "--dtype", "bf16"},
                         cli::smoke_spelling()));
  const auto smoke_yaml = cli::read_smoke_settings(parse_command_line({"--config", file.path}, cli::smoke_spelling()));
  for (const auto* s : {&smoke, &smoke_yaml}) {
    CHECK(s->max_steps == 5);
    CHECK(s->per_device_train_batch_size == 2);
    CHECK(s->cutoff_len == 16);
    CHECK(s->learning_rate == 0.01);
    CHECK(s->dtype == "bf16");
    CHECK(s->model == "tiny");
  }
  // An alias and its key are one key: the last given wins.
  CHECK(cli::read_smoke_settings(parse_command_line({"--max_steps", "9", "--steps", "3"}, cli::smoke_spelling()))
            .max_steps == 3);
  CHECK_THAT(error_of([] {
               cli::read_smoke_settings(parse_command_line({"--dtype", "fp8"}, cli::smoke_spelling()));
             }),
             Contains("command line: key 'dtype': must be fp32, bf16 or fp16, got 'fp8'"));
  const auto gen = cli::read_generate_settings(
      parse_command_line({"--model", "m", "--prompt", "Once upon", "--max-new-tokens", "4", "--greedy", "--ids",
                          "--top-k", "3", "--top-p", "0.5", "--no-add-bos"},
                         cli::generate_spelling()));
  CHECK(gen.prompt == "Once upon");
  CHECK(gen.max_new_tokens == 4);
  CHECK(gen.greedy);
  CHECK(gen.ids);
  CHECK(gen.top_k == 3);
  CHECK(gen.top_p == 0.5);
  CHECK(gen.add_bos == "false");
  CHECK_THAT(error_of([] {
               cli::read_generate_settings(parse_command_line(
                   {"--model", "m", "--prompt", "x", "--max-new-tokens", "-1"}, cli::generate_spelling()));
             }),
             Contains("command line: key 'max_new_tokens': must be >= 0, got -1"));
  // An unquoted prompt's other words are refused, not dropped.
  CHECK_THAT(error_of([] {
               cli::read_generate_settings(
                   parse_command_line({"--model", "m", "--prompt", "Once", "upon"}, cli::generate_spelling()));
             }),
             Contains("unexpected argument 'upon'"));
  // --add-bos alone is a switch, also before another key.
  CHECK(cli::read_generate_settings(
            parse_command_line({"--model", "m", "--add-bos", "--prompt", "x"}, cli::generate_spelling()))
            .add_bos == "true");
}
