// See settings.h. Each program's table is the one list of its keys: the reader, the --help text
// and the checks of a mode's keys all walk it.
#include "settings.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "kiln/common/device.h"
#include "kiln/ops/dispatch.h"

namespace kiln::cli {

using config::KeyTable;

namespace {

const char* const kDeviceHelp = "auto, cpu or cuda (auto: cuda when present)";
const char* const kBosHelp =
    "true: put the BOS token first (--add-bos); false: none (--no-add-bos); auto (default): as the model's "
    "training shards were (the checkpoint's kiln_data.json), else as HF's tokenizer(text) starts a sequence";

// Every program's command line: kebab case, its boolean keys alone for true, its older flags.
template <class C>
Spelling spelling_of(const KeyTable<C>& table, std::vector<Spelling::Alias> aliases,
                     std::vector<std::string> extra_switches = {}, std::vector<std::string> accumulate = {}) {
  Spelling s;
  s.kebab_case = true;
  s.aliases = std::move(aliases);
  s.switches = config::boolean_keys(table);
  s.switches.insert(s.switches.end(), extra_switches.begin(), extra_switches.end());
  s.accumulate = std::move(accumulate);
  for (const auto& key : table) s.keys.push_back(key.name);
  return s;
}

std::string hint(const std::string& program) {
  return fmt::format("{} --help lists its keys", program);
}

void check_device(const KeySources& given, const std::string& device) {
  try {
    kiln::device::check_spec(device);
  } catch (const std::invalid_argument& e) {
    given.fail("device", e.what());
  }
}

void check_add_bos(const KeySources& given, const std::string& add_bos) {
  if (add_bos != "auto" && add_bos != "true" && add_bos != "false") {
    given.fail("add_bos", fmt::format("expected true, false or auto, got '{}'", add_bos));
  }
}

void require(const KeySources& given, const std::string& key, const std::string& value, const std::string& what) {
  if (value.empty()) given.fail(key, fmt::format("missing required key ({})", what));
}

void check_dtype(const KeySources& given, const std::string& key, const std::string& value,
                 const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
    }
    given.fail(key, fmt::format("must be {}, got '{}'", list, value));
  }
}

// add_bos: a string key (auto, true, false) that stands alone as a switch and has a negative flag.
const Spelling::Alias kNoAddBos{"no-add-bos", "add_bos", "false"};

// ---- kiln-eval ----
const KeyTable<EvalSettings>& eval_table() {
  using S = EvalSettings;
  static const KeyTable<S> table = {
      {"model_name_or_path", &S::model_name_or_path, "checkpoint folder (config.json + safetensors) (--model)"},
      {"dataset_dir", &S::dataset_dir, "token shards from kiln-tokenize"},
      {"split", &S::split, "split to score (default: val when present, else train)"},
      {"cutoff_len", &S::cutoff_len, "tokens per packed block (default 1024)"},
      {"per_device_eval_batch_size", &S::per_device_eval_batch_size,
       "blocks per forward pass (default 8) (--batch-size)"},
      {"bf16", &S::bf16, "compute in bf16 (autocast)"},
      {"add_bos", &S::add_bos, kBosHelp},
      {"device", &S::device, kDeviceHelp},
  };
  return table;
}

// ---- kiln-generate ----
const KeyTable<GenerateSettings>& generate_table() {
  using S = GenerateSettings;
  static const KeyTable<S> table = {
      {"model_name_or_path", &S::model_name_or_path, "checkpoint folder (config.json + safetensors) (--model)"},
      {"prompt", &S::prompt, "text to continue"},
      {"tokenizer", &S::tokenizer,
       "byte, or a tokenizer.json / folder (default: the model folder's tokenizer.json, else the one its training "
       "shards were made with (kiln_data.json), else byte)"},
      {"max_new_tokens", &S::max_new_tokens, "tokens to generate (>= 0; default 200)"},
      {"add_bos", &S::add_bos, kBosHelp},
      {"greedy", &S::greedy, "argmax decoding (ignores temperature, top_k, top_p)"},
      {"temperature", &S::temperature, "softmax temperature (default 0.8)"},
      {"top_k", &S::top_k, "keep the k most likely tokens (0 = off; default 50)"},
      {"top_p", &S::top_p, "nucleus sampling threshold (1 = off; default 0.95)"},
      {"ids", &S::ids, "print the prompt's and the new tokens' ids as one JSON line instead of text"},
      {"seed", &S::seed, "sampling seed (default 0)"},
      {"device", &S::device, kDeviceHelp},
  };
  return table;
}

// ---- kiln-smoke ----
const KeyTable<SmokeSettings>& smoke_table() {
  using S = SmokeSettings;
  static const KeyTable<S> table = {
      {"model", &S::model, "preset name or model YAML (default tiny)"},
      {"max_steps", &S::max_steps, "optimizer steps (default 60) (--steps)"},
      {"per_device_train_batch_size", &S::per_device_train_batch_size, "sequences per step (default 8) (--batch-size)"},
      {"cutoff_len", &S::cutoff_len, "tokens per sequence (default 64) (--seq-len)"},
      {"learning_rate", &S::learning_rate, "AdamW learning rate (default 3e-3) (--lr)"},
      {"dtype", &S::dtype, "fp32, bf16 or fp16 parameters and compute (default fp32)"},
      {"device", &S::device, "auto, cpu or cuda (auto: the GPU if there is one; default cpu)"},
      {"seed", &S::seed, "seed for weights and data (default 0)"},
  };
  return table;
}

// ---- kiln-hf ----
const KeyTable<HfSettings>& hf_table() {
  using S = HfSettings;
  static const KeyTable<S> table = {
      {"model", &S::model, "init: preset name or model YAML (--model)"},
      {"model_name_or_path", &S::model_name_or_path, "HF checkpoint directory (--model)"},
      {"out", &S::out, "output directory (init, convert, train) or safetensors file (forward, copy, optimizer)"},
      {"in", &S::in, "inspect, copy: safetensors file (inspect: or checkpoint directory)"},
      {"batch", &S::batch, "safetensors file with input_ids [B, T] and optional labels"},
      {"dtype", &S::dtype, "fp32, bf16, fp16 or fp64 (default: the checkpoint's; init: fp32)"},
      {"grads", &S::grads, "forward: also write every parameter's gradient of the loss"},
      {"fused_loss", &S::fused_loss, "forward: the trainer's loss (chunked linear + cross-entropy; no logits written)"},
      {"autocast", &S::autocast, "forward: bf16 or fp16 autocast over fp32 weights, as the trainer's mixed precision"},
      {"kernels", &S::kernels,
       fmt::format("forward: ops backends as kiln-pretrain's key, e.g. kiln,linear=aten (default {})",
                   ops::kDefaultKernels)},
      {"max_steps", &S::max_steps, "train: AdamW steps on the batch (default 3) (--steps)"},
      {"learning_rate", &S::learning_rate, "train: learning rate (default 1e-3) (--lr)"},
      {"seed", &S::seed, "init: weight seed (default 0)"},
      {"max_shard_bytes", &S::max_shard_bytes, "largest safetensors file written before sharding (default 5e9)"},
  };
  return table;
}

const std::vector<std::pair<std::string, std::vector<std::string>>>& hf_command_keys() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> keys = {
      {"init", {"model", "out", "dtype", "seed", "max_shard_bytes"}},
      {"convert", {"model_name_or_path", "out", "dtype", "max_shard_bytes"}},
      {"forward", {"model_name_or_path", "batch", "out", "dtype", "grads", "fused_loss", "autocast", "kernels"}},
      {"train", {"model_name_or_path", "batch", "out", "dtype", "max_steps", "learning_rate", "max_shard_bytes"}},
      {"inspect", {"in"}},
      {"copy", {"in", "out"}},
      {"optimizer", {"model_name_or_path", "out"}},
  };
  return keys;
}

const std::vector<std::string>* hf_command(const std::string& command) {
  for (const auto& [name, keys] : hf_command_keys()) {
    if (name == command) return &keys;
  }
  return nullptr;
}

// ---- kiln-tokenize ----
const KeyTable<TokenizeSettings>& tokenize_table() {
  using S = TokenizeSettings;
  static const KeyTable<S> table = {
      {"tokenizer", &S::tokenizer,
       "'byte' or a tokenizer.json (or its folder): byte-level BPE (GPT-2, Llama-3 style) or SentencePiece-BPE "
       "(Llama-2, Mistral, TinyLlama layouts); default byte"},
      {"eos", &S::eos, "EOS token content of an HF tokenizer (default: from tokenizer_config.json / well-known names)"},
      {"input", &S::input,
       "input .txt/.jsonl/.jsonl.gz/.jsonl.zst/.json/.parquet files or folders (a,b or the key repeated)"},
      {"output_dir", &S::output_dir, "output folder of the shard set (--output)"},
      {"text_key", &S::text_key, "JSON field (Parquet column) holding the text; a null is an empty document"},
      {"txt_unit", &S::txt_unit, "a .txt file is one document ('file', default) or each non-empty line is ('line')"},
      {"val_fraction", &S::val_fraction, "fraction of documents for the 'val' split (every 1/F-th document)"},
      {"threads", &S::threads, "tokenizer threads (0 = all cores)"},
      {"shard_tokens", &S::shard_tokens, "tokens per shard (shards end at document ends; default 268435456)"},
      {"add_special_tokens", &S::add_special_tokens,
       "add the tokenizer's template tokens (e.g. BOS) to each document, as HF's add_special_tokens"},
      {"skip_bad_lines", &S::skip_bad_lines, "report malformed JSONL lines and skip them instead of failing"},
      {"overwrite", &S::overwrite, "replace an existing shard set in output_dir"},
      {"progress", &S::progress, "a progress bar on a terminal (default true; false: --no-progress)"},
      {"default_corpus", &S::default_corpus,
       "build (or find) the embedded default corpus's shards in a folder under output_dir (default: the cache) and "
       "print that folder"},
      {"bench", &S::bench, "time encoding of the input single- and multi-threaded; prints a JSON line"},
      {"repeat", &S::repeat, "bench: passes over the input (default 1)"},
      {"decode", &S::decode,
       "print the text of each line of FILE, a JSON list of ids, as one JSON string per line (invalid UTF-8 as "
       "U+FFFD)"},
      {"skip_special_tokens", &S::skip_special_tokens,
       "decode: leave special tokens out, as HF's decode(skip_special_tokens=True)"},
  };
  return table;
}

// ---- kiln-bench ----
const KeyTable<BenchSettings>& bench_table() {
  using S = BenchSettings;
  static const KeyTable<S> table = {
      {"device", &S::device, kDeviceHelp},
      {"dtype", &S::dtype, "fp32, bf16 or fp16 (default: bf16 on cuda, fp32 on cpu)"},
      {"ops", &S::ops,
       "rmsnorm, swiglu, rope, linear_ce, linear, attention, comm (default: the first five; attention and comm only "
       "when named; comm under torchrun/srun); linear: tokens x hidden -> intermediate, fp32 weight under dtype "
       "autocast"},
      {"comm_max_bytes", &S::comm_max_bytes,
       "comm: largest buffer, from 1 MiB up by x4; default 1 GiB on cuda, 64 MiB on cpu"},
      {"tokens", &S::tokens, "rows (batch x sequence); default 8192 on cuda, 1024 on cpu"},
      {"hidden", &S::hidden, "hidden size; default 4096 on cuda, 1024 on cpu"},
      {"intermediate", &S::intermediate, "MLP width; default 14336 on cuda, 2816 on cpu"},
      {"vocab", &S::vocab, "vocabulary for linear_ce; default 128256 on cuda, 32000 on cpu"},
      {"ce_hidden", &S::ce_hidden, "hidden size for linear_ce; default 2048 (Llama 3.2 1B's head) on cuda, 512 on cpu"},
      {"seqlens", &S::seqlens,
       "attention: sequence lengths T; default 512,1024,2048,4096,8192 on cuda, 128,256 on cpu"},
      {"head_dims", &S::head_dims, "attention: head dims D (default 64,128)"},
      {"batch", &S::batch, "attention: batch B; default 16384 tokens / T (at least 1) on cuda, 1 on cpu"},
      {"heads", &S::heads, "attention: query heads; default 16 on cuda, 4 on cpu"},
      {"kv_heads", &S::kv_heads, "attention: key/value heads, dividing heads (GQA); default = heads"},
      {"docs", &S::docs,
       "attention: pack this many equal documents into each row (segment ids; kiln's kernels skip the tile pairs of "
       "different documents, SDPA gets the [B, 1, T, T] mask); default 0, one causal sequence"},
      {"iters", &S::iters,
       "timed iterations per case (median reported; attention: fastest sample, each repeating the call for about "
       "10 ms); default 5"},
      {"json", &S::json, "also write the results to this JSON file"},
      {"predict", &S::predict,
       "beside each kiln row of rmsnorm, swiglu and rope, the fraction of copy bandwidth its kernels' machine code "
       "predicts on this GPU (docs/kernel_sass.json, from scripts/check_kernel_sass.py), and the table of those "
       "predictions for V100, A100 and H200"},
  };
  return table;
}

void check_positive(const KeySources& given, const std::string& key, int64_t value) {
  if (given.given(key) && value <= 0) given.fail(key, fmt::format("must be positive, got {}", value));
}

}  // namespace

std::string settings_help(const std::string& usage, const std::vector<KeyDoc>& keys) {
  std::vector<KeyDoc> all = {
      {"config", "FILE", "a YAML file of these keys (the command line wins over it; given twice, the last wins)"}};
  all.insert(all.end(), keys.begin(), keys.end());
  return usage + "\n\n" + config::keys_help(all) +
         "\nKeys are snake_case (LLaMA-Factory's names where it has one); on the command line --KEY VALUE or\n"
         "--KEY=VALUE, a key in kebab case too (--cutoff-len), a boolean key alone for true, the older flags in\n"
         "parentheses as aliases. A key given twice: the last wins. An unknown key is an error.\n";
}

data::BosRule bos_rule(const std::string& add_bos) {
  return add_bos == "true" ? data::BosRule::kAdd : add_bos == "false" ? data::BosRule::kNone : data::BosRule::kAuto;
}

Spelling eval_spelling() {
  return spelling_of(eval_table(),
                     {{"model", "model_name_or_path", std::nullopt},
                      {"batch-size", "per_device_eval_batch_size", std::nullopt},
                      kNoAddBos},
                     {"add_bos"});
}

std::vector<KeyDoc> eval_keys() {
  return config::key_docs(eval_table());
}

EvalSettings read_eval_settings(const CommandLine& line) {
  EvalSettings s;
  s.given = config::read_settings(s, eval_table(), line.config_path, line.overrides, hint("kiln-eval"));
  require(s.given, "model_name_or_path", s.model_name_or_path, "a checkpoint folder: --model_name_or_path DIR");
  require(s.given, "dataset_dir", s.dataset_dir, "token shards from kiln-tokenize: --dataset_dir DIR");
  if (s.cutoff_len < 2) s.given.fail("cutoff_len", fmt::format("must be >= 2, got {}", s.cutoff_len));
  if (s.per_device_eval_batch_size < 1) {
    s.given.fail("per_device_eval_batch_size", fmt::format("must be >= 1, got {}", s.per_device_eval_batch_size));
  }
  check_add_bos(s.given, s.add_bos);
  check_device(s.given, s.device);
  return s;
}

Spelling generate_spelling() {
  return spelling_of(generate_table(), {{"model", "model_name_or_path", std::nullopt}, kNoAddBos}, {"add_bos"});
}

std::vector<KeyDoc> generate_keys() {
  return config::key_docs(generate_table());
}

GenerateSettings read_generate_settings(const CommandLine& line) {
  GenerateSettings s;
  s.given = config::read_settings(s, generate_table(), line.config_path, line.overrides, hint("kiln-generate"));
  require(s.given, "model_name_or_path", s.model_name_or_path, "a checkpoint folder: --model_name_or_path DIR");
  if (!s.given.given("prompt")) s.given.fail("prompt", "missing required key (the text to continue: --prompt TEXT)");
  if (s.max_new_tokens < 0) s.given.fail("max_new_tokens", fmt::format("must be >= 0, got {}", s.max_new_tokens));
  if (s.top_k < 0) s.given.fail("top_k", fmt::format("must be >= 0, got {}", s.top_k));
  if (s.seed < 0) s.given.fail("seed", fmt::format("must be >= 0, got {}", s.seed));
  check_add_bos(s.given, s.add_bos);
  check_device(s.given, s.device);
  return s;
}

Spelling smoke_spelling() {
  return spelling_of(smoke_table(), {{"steps", "max_steps", std::nullopt},
                                     {"batch-size", "per_device_train_batch_size", std::nullopt},
                                     {"seq-len", "cutoff_len", std::nullopt},
                                     {"lr", "learning_rate", std::nullopt}});
}

std::vector<KeyDoc> smoke_keys() {
  return config::key_docs(smoke_table());
}

SmokeSettings read_smoke_settings(const CommandLine& line) {
  SmokeSettings s;
  s.given = config::read_settings(s, smoke_table(), line.config_path, line.overrides, hint("kiln-smoke"));
  check_dtype(s.given, "dtype", s.dtype, {"fp32", "bf16", "fp16"});
  check_device(s.given, s.device);
  if (s.max_steps <= 0) s.given.fail("max_steps", fmt::format("must be > 0, got {}", s.max_steps));
  if (s.per_device_train_batch_size <= 0) {
    s.given.fail("per_device_train_batch_size", fmt::format("must be > 0, got {}", s.per_device_train_batch_size));
  }
  if (s.cutoff_len < 2) s.given.fail("cutoff_len", fmt::format("must be >= 2, got {}", s.cutoff_len));
  if (s.seed < 0) s.given.fail("seed", fmt::format("must be >= 0, got {}", s.seed));
  return s;
}

const std::vector<std::string>& hf_commands() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, keys] : hf_command_keys()) out.push_back(name);
    return out;
  }();
  return names;
}

const std::string& HfSettings::required(const std::string& key) const {
  const std::string* value = nullptr;
  for (const auto& k : hf_table()) {
    if (k.name == key) value = &(this->*std::get<std::string HfSettings::*>(k.field));
  }
  if (value == nullptr) throw std::logic_error("HfSettings::required: no string key '" + key + "'");
  if (value->empty()) given.fail(key, fmt::format("missing required key (kiln-hf {} --help)", command));
  return *value;
}

Spelling hf_spelling(const std::string& command) {
  std::vector<Spelling::Alias> aliases = {{"steps", "max_steps", std::nullopt}, {"lr", "learning_rate", std::nullopt}};
  if (command != "init") aliases.push_back({"model", "model_name_or_path", std::nullopt});
  return spelling_of(hf_table(), aliases);
}

std::vector<KeyDoc> hf_keys(const std::string& command) {
  const std::vector<std::string>* keys = hf_command(command);
  return config::key_docs(keys ? config::select_keys(hf_table(), *keys) : hf_table());
}

HfSettings read_hf_settings(const std::string& command, const CommandLine& line) {
  const std::vector<std::string>* keys = hf_command(command);
  if (keys == nullptr) {
    throw config::ConfigError(fmt::format("command line: unknown command '{}' ({}; kiln-hf --help)", command,
                                          fmt::format("init, convert, forward, train, inspect, copy, optimizer")));
  }
  HfSettings s;
  s.command = command;
  s.kernels = ops::kDefaultKernels;
  s.given = config::read_settings(s, hf_table(), line.config_path, line.overrides,
                                  fmt::format("kiln-hf {} --help lists its keys", command));
  config::check_keys_apply(s.given, *keys, command, fmt::format("kiln-hf {} --help lists its keys", command));
  if (!s.dtype.empty()) check_dtype(s.given, "dtype", s.dtype, {"fp32", "bf16", "fp16", "fp64"});
  if (!s.autocast.empty()) check_dtype(s.given, "autocast", s.autocast, {"bf16", "fp16"});
  if (s.max_steps < 0) s.given.fail("max_steps", fmt::format("must be >= 0, got {}", s.max_steps));
  if (s.seed < 0) s.given.fail("seed", fmt::format("must be >= 0, got {}", s.seed));
  check_positive(s.given, "max_shard_bytes", s.max_shard_bytes);
  return s;
}

std::string TokenizeSettings::mode() const {
  if (default_corpus) return "default_corpus";
  if (!decode.empty()) return "decode";
  if (bench) return "bench";
  return "";
}

Spelling tokenize_spelling() {
  return spelling_of(tokenize_table(), {{"output", "output_dir", std::nullopt}, {"no-progress", "progress", "false"}},
                     {}, {"input"});
}

std::vector<KeyDoc> tokenize_keys() {
  return config::key_docs(tokenize_table());
}

TokenizeSettings read_tokenize_settings(const CommandLine& line) {
  TokenizeSettings s;
  s.given = config::read_settings(s, tokenize_table(), line.config_path, line.overrides, hint("kiln-tokenize"));
  // One mode at a time, each with its own keys (the mode keys themselves, off, apply anywhere).
  const std::vector<std::string> mode_keys = {"default_corpus", "decode", "bench"};
  std::vector<std::string> modes;
  if (s.default_corpus) modes.push_back("default_corpus");
  if (!s.decode.empty()) modes.push_back("decode");
  if (s.bench) modes.push_back("bench");
  if (modes.size() > 1) s.given.fail(modes[1], fmt::format("give {} or {}, not both", modes[0], modes[1]));
  std::vector<std::string> keys;
  const std::string mode = s.mode();
  if (mode == "default_corpus") {
    keys = {"output_dir"};
  } else if (mode == "decode") {
    keys = {"tokenizer", "eos", "skip_special_tokens"};
  } else if (mode == "bench") {
    keys = {"repeat", "input", "tokenizer", "eos", "text_key", "txt_unit", "threads", "skip_bad_lines"};
  } else {
    for (const auto& key : tokenize_table()) {
      if (key.name != "skip_special_tokens" && key.name != "repeat") keys.push_back(key.name);
    }
  }
  keys.insert(keys.end(), mode_keys.begin(), mode_keys.end());
  config::check_keys_apply(s.given, keys, mode.empty() ? "tokenizing" : mode, "kiln-tokenize --help");
  if (s.txt_unit != "file" && s.txt_unit != "line") {
    s.given.fail("txt_unit", fmt::format("must be file or line, got '{}'", s.txt_unit));
  }
  if (s.val_fraction < 0 || s.val_fraction >= 1) {
    s.given.fail("val_fraction", fmt::format("must be in [0, 1), got {}", s.val_fraction));
  }
  if (s.threads < 0) s.given.fail("threads", fmt::format("must be >= 0, got {}", s.threads));
  if (s.shard_tokens <= 0) s.given.fail("shard_tokens", fmt::format("must be > 0, got {}", s.shard_tokens));
  if (s.repeat < 1) s.given.fail("repeat", fmt::format("must be >= 1, got {}", s.repeat));
  if ((mode.empty() || mode == "bench") && s.input.empty()) {
    s.given.fail("input", "missing required key (files or folders: --input PATH)");
  }
  if (mode.empty() && s.output_dir.empty()) {
    s.given.fail("output_dir", "missing required key (folder for the shard set: --output_dir DIR)");
  }
  return s;
}

bool BenchSettings::runs(const std::string& op) const {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

Spelling bench_spelling() {
  return spelling_of(bench_table(), {});
}

std::vector<KeyDoc> bench_keys() {
  return config::key_docs(bench_table());
}

BenchSettings read_bench_settings(const CommandLine& line) {
  BenchSettings s;
  s.given = config::read_settings(s, bench_table(), line.config_path, line.overrides, hint("kiln-bench"));
  check_device(s.given, s.device);
  if (!s.dtype.empty()) check_dtype(s.given, "dtype", s.dtype, {"fp32", "bf16", "fp16"});
  for (const std::string& op : s.ops) {
    static const std::vector<std::string> known = {"rmsnorm", "swiglu",    "rope", "linear_ce",
                                                   "linear",  "attention", "comm"};
    if (std::find(known.begin(), known.end(), op) == known.end()) {
      s.given.fail("ops",
                   fmt::format("unknown op '{}' (rmsnorm, swiglu, rope, linear_ce, linear, attention, comm)", op));
    }
  }
  // An op's sizes without the op would be silently ignored.
  for (const char* key : {"seqlens", "head_dims", "batch", "heads", "kv_heads", "docs"}) {
    if (s.given.given(key) && !s.runs("attention")) {
      s.given.fail(key, "applies to ops attention, which ops does not name");
    }
  }
  if (s.given.given("comm_max_bytes") && !s.runs("comm")) {
    s.given.fail("comm_max_bytes", "applies to ops comm, which ops does not name");
  }
  // A size given: positive (left out, 0: the device's default).
  for (const auto& [key, value] : std::vector<std::pair<const char*, int64_t>>{{"comm_max_bytes", s.comm_max_bytes},
                                                                               {"tokens", s.tokens},
                                                                               {"hidden", s.hidden},
                                                                               {"intermediate", s.intermediate},
                                                                               {"vocab", s.vocab},
                                                                               {"ce_hidden", s.ce_hidden},
                                                                               {"batch", s.batch},
                                                                               {"heads", s.heads},
                                                                               {"kv_heads", s.kv_heads},
                                                                               {"docs", s.docs},
                                                                               {"iters", s.iters}}) {
    check_positive(s.given, key, value);
  }
  for (const auto& [key, values] :
       std::vector<std::pair<const char*, std::vector<int64_t>>>{{"seqlens", s.seqlens}, {"head_dims", s.head_dims}}) {
    for (const int64_t v : values) {
      if (v <= 0) s.given.fail(key, fmt::format("must be positive, got {}", v));
    }
  }
  if (s.given.given("heads") && s.given.given("kv_heads") && s.heads % s.kv_heads != 0) {
    s.given.fail("kv_heads", fmt::format("({}) must divide heads ({})", s.kv_heads, s.heads));
  }
  return s;
}

}  // namespace kiln::cli
