// The settings of kiln-eval, kiln-generate, kiln-hf, kiln-tokenize, kiln-bench and kiln-smoke: one
// struct and one key table (config/key_table.h) per program, read from `--config FILE` (YAML) and
// then from the command line's `--key value` overrides, with kiln-pretrain's and kiln-profile's
// rules (unknown key: an error naming the source and the key; a key given twice on the command
// line: the last wins; the command line wins over the file; contradictory keys refused).
//
// Keys are snake_case, LLaMA-Factory's names where it has one (model_name_or_path, dataset_dir,
// cutoff_len, per_device_eval_batch_size, learning_rate, max_steps, output_dir, ...). The command
// line also takes every key in kebab case (--cutoff-len), a boolean key alone for true
// (--greedy), and the programs' older flags as aliases (--model, --batch-size, --lr, --steps,
// --seq-len, --output, --no-add-bos, --no-progress): every command line that worked with the
// programs' cxxopts parsers works unchanged. Each reader checks the values' ranges and the keys'
// combinations, naming the key's source; what needs a file or a device is the program's to check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/config/key_table.h"
#include "kiln/data/tokenize.h"

namespace kiln::cli {

using config::CommandLine;
using config::KeyDoc;
using config::KeySources;
using config::Spelling;

// --help's text for a program: `usage`, then its keys (with --config FILE first), then how a
// command line writes them.
std::string settings_help(const std::string& usage, const std::vector<KeyDoc>& keys);

// kiln-eval: mean loss and perplexity of a checkpoint over a split of token shards.
struct EvalSettings {
  std::string model_name_or_path;  // required
  std::string dataset_dir;         // required
  std::string split;               // "" = val when present, else train
  int64_t cutoff_len = 1024;
  int64_t per_device_eval_batch_size = 8;
  bool bf16 = false;
  std::string add_bos = "auto";  // auto | true | false (data::BosRule)
  std::string device = "auto";
  KeySources given;
};
Spelling eval_spelling();
std::vector<KeyDoc> eval_keys();
EvalSettings read_eval_settings(const CommandLine& line);

// kiln-generate: text from a checkpoint.
struct GenerateSettings {
  std::string model_name_or_path;  // required
  std::string prompt;              // required
  std::string tokenizer;           // "" = the model folder's, else its shards' (kiln_data.json), else byte
  int64_t max_new_tokens = 200;
  std::string add_bos = "auto";
  bool greedy = false;
  double temperature = 0.8;
  int64_t top_k = 50;
  double top_p = 0.95;
  bool ids = false;
  int64_t seed = 0;
  std::string device = "auto";
  KeySources given;
};
Spelling generate_spelling();
std::vector<KeyDoc> generate_keys();
GenerateSettings read_generate_settings(const CommandLine& line);

// add_bos's value as the data layer's rule.
data::BosRule bos_rule(const std::string& add_bos);

// kiln-smoke: a preset trained for a few steps on a synthetic language.
struct SmokeSettings {
  std::string model = "tiny";  // a preset or a model YAML, as kiln-pretrain's key
  int64_t max_steps = 60;
  int64_t per_device_train_batch_size = 8;
  int64_t cutoff_len = 64;
  double learning_rate = 3e-3;
  std::string dtype = "fp32";
  std::string device = "cpu";
  int64_t seed = 0;
  KeySources given;
};
Spelling smoke_spelling();
std::vector<KeyDoc> smoke_keys();
SmokeSettings read_smoke_settings(const CommandLine& line);

// kiln-hf COMMAND: Hugging Face checkpoints. Each command reads some of the keys (hf_keys).
const std::vector<std::string>& hf_commands();  // init, convert, forward, train, inspect, copy, optimizer
struct HfSettings {
  std::string command;
  std::string model;               // init: a preset or a model YAML
  std::string model_name_or_path;  // the other commands: an HF checkpoint folder
  std::string out, in, batch;
  std::string dtype;  // "" = the checkpoint's (init: fp32)
  bool grads = false, fused_loss = false;
  std::string autocast;
  std::string kernels;  // ops::kDefaultKernels
  int64_t max_steps = 3;
  double learning_rate = 1e-3;
  int64_t seed = 0;
  int64_t max_shard_bytes = 5000000000;
  KeySources given;
  // The value of a key `command` needs; throws naming the key when it is missing.
  const std::string& required(const std::string& key) const;
};
// `command`'s spelling: for init --model is the key model, for the others model_name_or_path.
Spelling hf_spelling(const std::string& command);
// `command`'s keys; "" = every key.
std::vector<KeyDoc> hf_keys(const std::string& command);
// Throws ConfigError for an unknown command, a key `command` does not read, or a bad value.
HfSettings read_hf_settings(const std::string& command, const CommandLine& line);

// kiln-tokenize: text -> token shards, or one of three modes (default_corpus, decode, bench).
struct TokenizeSettings {
  std::string tokenizer = "byte";
  std::string eos;
  std::vector<std::string> input;
  std::string output_dir;
  std::string text_key = "text";
  std::string txt_unit = "file";
  double val_fraction = 0;
  int64_t threads = 0;
  int64_t shard_tokens = 268435456;
  bool add_special_tokens = false, skip_bad_lines = false, overwrite = false, progress = true;
  bool default_corpus = false, bench = false;
  int64_t repeat = 1;
  std::string decode;
  bool skip_special_tokens = false;
  KeySources given;
  // "default_corpus", "decode", "bench", or "" (tokenizing).
  std::string mode() const;
};
Spelling tokenize_spelling();
std::vector<KeyDoc> tokenize_keys();
TokenizeSettings read_tokenize_settings(const CommandLine& line);

// kiln-bench: the fused ops against ATen, attention against SDPA, the collectives. A size left
// out (0) takes the device's default (the bench's main).
struct BenchSettings {
  std::string device = "auto";
  std::string dtype;  // "" = bf16 on cuda, fp32 on cpu
  std::vector<std::string> ops{"rmsnorm", "swiglu", "rope", "linear_ce", "linear"};
  int64_t comm_max_bytes = 0, tokens = 0, hidden = 0, intermediate = 0, vocab = 0, ce_hidden = 0;
  std::vector<int64_t> seqlens;  // empty = the device's default
  std::vector<int64_t> head_dims{64, 128};
  int64_t batch = 0, heads = 0, kv_heads = 0;
  int64_t docs = 0;  // attention: documents packed per row (0: one causal sequence)
  int64_t iters = 5;
  std::string json;
  bool predict = false;
  KeySources given;
  bool runs(const std::string& op) const;
};
Spelling bench_spelling();
std::vector<KeyDoc> bench_keys();
BenchSettings read_bench_settings(const CommandLine& line);

}  // namespace kiln::cli
