// HF-layout output files: see run_outputs.h.
#include "kiln/train/hf/run_outputs.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "kiln/common/env.h"
#include "kiln/data/hf_tokenizer.h"
#include "kiln/io/safetensors.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string dump(const json& j, int indent = -1) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("{}: cannot read", path.string()));
  return text.str();
}

json read_json_object(const fs::path& path) {
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not valid JSON: {}", path.string(), e.what()));
  }
  if (!j.is_object()) throw std::runtime_error(fmt::format("{}: expected a JSON object", path.string()));
  return j;
}

// A special token of tokenizer_config.json / special_tokens_map.json: a string or an AddedToken
// object ({"content": ...}); "" when absent or null.
std::string token_content(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

}  // namespace

bool hf_evaluation_rules(const PretrainConfig& c) {
  return !c.dataset.empty() || c.do_eval >= 0 || !c.eval_strategy.empty();
}

EvalSchedule eval_schedule(const PretrainConfig& c, int64_t total_steps) {
  EvalSchedule s;
  if (!hf_evaluation_rules(c)) {
    s.every = resolve_steps(c.eval_steps, total_steps);  // kiln's own configs
    s.at_train_end = s.after_training = true;
    return s;
  }
  const bool steps = c.eval_strategy == "steps";  // HF's default strategy is "no"
  s.every = steps ? resolve_steps(c.eval_steps > 0 ? c.eval_steps : c.logging_steps, total_steps) : 0;
  s.at_train_end = steps;
  s.after_training = s.required = c.do_eval == 1 || steps;  // TrainingArguments: a strategy implies do_eval
  return s;
}

const std::string& empty_chat_template() {
  // llamafactory/data/template.py, Template._get_jinja_template for TEMPLATES["empty"] (no prefix,
  // no default system, user and assistant slots "{{content}}"), byte for byte as a run writes it.
  static const std::string text =
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
      "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% endif %}"
      "{% if system_message is defined %}{{ system_message }}{% endif %}"
      "{% for message in loop_messages %}{% set content = message['content'] %}"
      "{% if message['role'] == 'user' %}{{ content }}{% elif message['role'] == 'assistant' %}{{ content }}"
      "{% endif %}{% endfor %}";
  return text;
}

ModelFolderFiles model_folder_files(const std::string& tokenizer_json, int64_t data_bos, int64_t data_eos,
                                    const std::string& model_dir, int64_t model_bos, int64_t model_eos) {
  ModelFolderFiles out;
  int64_t bos = data_bos, eos = data_eos, pad = data_eos;  // the byte tokenizer: pad = EOS, as the fix-up
  if (!tokenizer_json.empty() && tokenizer_json != "byte") {
    const fs::path file(tokenizer_json);
    const fs::path dir = file.parent_path();
    out.tokenizer_dir = dir.string();
    const data::HfTokenizer tokenizer(file.string());
    const fs::path config_path = dir / "tokenizer_config.json", map_path = dir / "special_tokens_map.json";
    const bool has_config = fs::is_regular_file(config_path), has_map = fs::is_regular_file(map_path);
    json config = has_config ? read_json_object(config_path) : json::object();
    json map = has_map ? read_json_object(map_path) : json::object();
    // transformers reads a special token from tokenizer_config.json, else special_tokens_map.json.
    const auto special = [&](const char* key) {
      const std::string c = token_content(config, key);
      return c.empty() ? token_content(map, key) : c;
    };
    const auto id_of = [&](const std::string& content, const fs::path& where, const char* key) -> int64_t {
      if (content.empty()) return -1;
      const int32_t id = tokenizer.token_to_id(content);
      if (id < 0) {
        throw std::runtime_error(
            fmt::format("{}: {} '{}' is not a token of {}", where.string(), key, content, file.string()));
      }
      return id;
    };
    const fs::path source = has_config ? config_path : map_path;
    std::string eos_content = special("eos_token");
    eos = eos_content.empty() ? tokenizer.eos_id() : id_of(eos_content, source, "eos_token");
    if (eos_content.empty()) {
      const int32_t id = static_cast<int32_t>(eos);
      eos_content = tokenizer.decode(std::span<const int32_t>(&id, 1));
      config["eos_token"] = eos_content;
    }
    bos = id_of(special("bos_token"), source, "bos_token");
    // LLaMA-Factory's fix_special_tokens: pad_token = eos_token when the tokenizer has none.
    const std::string pad_content = special("pad_token");
    if (pad_content.empty()) {
      config["pad_token"] = eos_content;
      if (has_map) map["pad_token"] = eos_content;
      pad = eos;
    } else {
      pad = id_of(pad_content, source, "pad_token");
    }
    // load_tokenizer's arguments, which transformers keeps in the saved config.
    config["padding_side"] = "right";
    config["split_special_tokens"] = false;
    if (!has_config) config["tokenizer_class"] = "PreTrainedTokenizerFast";
    // The chat template: the tokenizer's own (a chat_template.jinja beside it, or the config's
    // string), else LLaMA-Factory's `empty` one (template.py, fix_jinja_template).
    std::string chat_template = empty_chat_template();
    if (fs::is_regular_file(dir / "chat_template.jinja")) {
      chat_template = read_file(dir / "chat_template.jinja");
    } else if (config.contains("chat_template") && config["chat_template"].is_string()) {
      chat_template = config["chat_template"].get<std::string>();
    }
    out.files.emplace_back("tokenizer.json", read_file(file));
    out.files.emplace_back("tokenizer_config.json", dump(config, 2) + "\n");
    if (has_map) out.files.emplace_back("special_tokens_map.json", dump(map, 2) + "\n");
    out.files.emplace_back("chat_template.jinja", chat_template);
  }

  // generation_config.json: the model folder's, else transformers' GenerationConfig.from_model_config.
  json gen;
  const fs::path gen_path = model_dir.empty() ? fs::path() : fs::path(model_dir) / "generation_config.json";
  if (!model_dir.empty() && fs::is_regular_file(gen_path)) {
    gen = read_json_object(gen_path);
  } else {
    gen = {{"_from_model_config", true}};
    if (model_bos >= 0) gen["bos_token_id"] = model_bos;
    if (model_eos >= 0) gen["eos_token_id"] = model_eos;
  }
  // transformers' align_special_tokens (trainer_utils.py): EOS, then BOS, then PAD.
  const auto gen_id = [&](const char* key) {
    return gen.contains(key) && gen[key].is_number_integer() ? gen[key].get<int64_t>() : int64_t{-1};
  };
  int64_t config_bos = model_bos, config_eos = model_eos;
  const auto set_or_drop = [&](const char* key, int64_t id) {
    if (id < 0) {
      gen.erase(key);  // None: to_json_string(use_diff=True) leaves it out
    } else {
      gen[key] = id;
    }
  };
  bool new_eos = eos != config_eos;
  json gen_eos = gen.contains("eos_token_id") ? gen["eos_token_id"] : json(nullptr);
  if (gen_eos.is_null()) {
    new_eos = new_eos || eos >= 0;
  } else {
    if (!gen_eos.is_array()) gen_eos = json::array({gen_eos});
    gen["eos_token_id"] = gen_eos;
    new_eos = new_eos || std::find(gen_eos.begin(), gen_eos.end(), json(eos)) == gen_eos.end();
  }
  if (new_eos) {
    config_eos = eos;
    json all = json::array();
    if (eos >= 0) all.push_back(eos);
    if (gen_eos.is_array()) {
      for (const auto& id : gen_eos) {
        if (!id.is_null()) all.push_back(id);
      }
    }
    gen["eos_token_id"] = all;
  }
  if (bos != config_bos || bos != gen_id("bos_token_id")) {
    config_bos = bos;
    set_or_drop("bos_token_id", bos);
  }
  if (pad != gen_id("pad_token_id")) set_or_drop("pad_token_id", pad);
  out.files.emplace_back("generation_config.json", dump(gen, 2) + "\n");
  out.bos_token_id = config_bos;
  out.eos_token_id = config_eos;
  out.pad_token_id = pad;
  return out;
}

void write_model_folder_files(const ModelFolderFiles& files, const std::string& dir) {
  for (const auto& [name, text] : files.files) io::write_file_atomic((fs::path(dir) / name).string(), text);
}

std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  // nlohmann writes the shortest round-trip digits in Python's repr layout (exponent below 1e-4
  // and from 1e16, at least two exponent digits, ".0" on integral values).
  return json(v).dump();
}

std::string python_timedelta(int64_t seconds) {
  const int64_t days = seconds / 86400, rest = seconds % 86400;
  std::string out = days > 0 ? fmt::format("{} day{}, ", days, days == 1 ? "" : "s") : "";
  return out + fmt::format("{}:{:02d}:{:02d}", rest / 3600, rest / 60 % 60, rest % 60);
}

namespace {

// Python's round(x, 2): the decimal nearest to the binary value (printf rounds exactly, ties to
// even, as CPython's dtoa), read back.
double python_round2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", x);
  return std::strtod(buf, nullptr);
}

}  // namespace

std::string trainer_log_line(const json& entry, int64_t current, int64_t total, double elapsed) {
  std::vector<std::pair<std::string, std::string>> kv;
  kv.emplace_back("current_steps", std::to_string(current));
  kv.emplace_back("total_steps", std::to_string(total));
  // llamafactory/train/callbacks.py, LogCallback.on_log: these keys in this order, None dropped.
  for (const auto& [key, from] : std::vector<std::pair<const char*, const char*>>{
           {"loss", "loss"}, {"eval_loss", "eval_loss"}, {"lr", "learning_rate"}, {"epoch", "epoch"}}) {
    const auto it = entry.find(from);
    if (it == entry.end() || it->is_null()) continue;
    kv.emplace_back(key, it->is_number_float() ? python_float(it->get<double>()) : dump(*it));
  }
  kv.emplace_back("percentage",
                  total != 0
                      ? python_float(python_round2(static_cast<double>(current) / static_cast<double>(total) * 100))
                      : "100");
  const double per_step = current != 0 ? elapsed / static_cast<double>(current) : 0.0;
  kv.emplace_back("elapsed_time", "\"" + python_timedelta(static_cast<int64_t>(elapsed)) + "\"");
  kv.emplace_back(
      "remaining_time",
      "\"" + python_timedelta(static_cast<int64_t>(static_cast<double>(total - current) * per_step)) + "\"");
  std::string line = "{";
  for (size_t i = 0; i < kv.size(); ++i) {
    line += fmt::format("{}\"{}\": {}", i ? ", " : "", kv[i].first, kv[i].second);
  }
  return line + "}";
}

void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open for appending: {}", path, std::strerror(errno)));
  const std::string text = line + "\n";
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    throw std::runtime_error(fmt::format("{}: cannot write: {}", path, n < 0 ? std::strerror(err) : "short write"));
  }
}

namespace {

// A scalar of the card's YAML front matter as PyYAML's dump writes it: plain when it can be,
// else single-quoted.
std::string yaml_scalar(const std::string& s) {
  static const std::set<std::string> special = {"",      "~",     "null",  "Null", "NULL", "true", "True", "TRUE",
                                                "false", "False", "FALSE", "yes",  "Yes",  "YES",  "no",   "No",
                                                "NO",    "on",    "On",    "ON",   "off",  "Off",  "OFF"};
  bool plain = !special.contains(s) && std::string("-?:,[]{}#&*!|>'\"%@` ").find(s[0]) == std::string::npos &&
               s.back() != ' ' && s.find(": ") == std::string::npos && s.find(" #") == std::string::npos;
  for (const unsigned char ch : s) plain = plain && ch >= 0x20 && ch < 0x7f;
  if (plain) {
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    plain = end != s.c_str() + s.size();  // a number would read back as one
  }
  if (plain) return s;
  std::string q = "'";
  for (const char ch : s) q += ch == '\'' ? std::string("''") : std::string(1, ch);
  return q + "'";
}

// modelcard.py's _maybe_round: a float with more than 4 decimals in its repr as "%.4f", else str().
std::string maybe_round(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_number_float()) return dump(v);
  const double x = v.get<double>();
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  const std::string repr = python_float(x);
  const auto dot = repr.find('.');
  if (dot != std::string::npos && repr.size() - dot - 1 > 4) return fmt::format("{:.4f}", x);
  return repr;
}

std::string capitalized_words(const std::string& key) {
  std::string out;
  bool start = true;
  for (const char ch : key) {
    if (ch == '_') {
      out += ' ';
      start = true;
      continue;
    }
    out += start ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch)))
                 : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    start = false;
  }
  return out;
}

// What HF's own evaluation entry holds; kiln's extra keys (<prefix>_perplexity, <prefix>_tokens)
// would otherwise become columns of the card's table. The prefix is eval, or eval_<name> per
// dataset with eval_on_each_dataset.
json hf_entry(const json& entry) {
  std::string prefix;
  for (const auto& [key, value] : entry.items()) {
    if (key.rfind("eval", 0) == 0 && key.size() > 5 && key.compare(key.size() - 5, 5, "_loss") == 0)
      prefix = key.substr(0, key.size() - 5);
  }
  if (prefix.empty()) return entry;
  json out = json::object();
  for (const std::string key : {prefix + "_loss", prefix + "_runtime", prefix + "_samples_per_second",
                                prefix + "_steps_per_second", std::string("epoch"), std::string("step")}) {
    if (entry.contains(key)) out[key] = entry[key];
  }
  return out;
}

}  // namespace

std::string model_card_text(const ModelCard& card) {
  std::vector<json> history;
  for (const auto& e : card.log_history) {
    if (e.is_object()) history.push_back(hf_entry(e));
  }
  // parse_log_history: the rows before the summary entry, the results of the last evaluation.
  size_t summary = 0;
  while (summary < history.size() && !history[summary].contains("train_runtime")) ++summary;
  std::optional<std::vector<std::vector<std::pair<std::string, std::string>>>> rows;
  if (summary < history.size()) {
    rows.emplace();
    std::string training_loss = "No log";
    for (size_t i = 0; i < summary; ++i) {
      const json& e = history[i];
      if (e.contains("loss")) training_loss = maybe_round(e["loss"]);
      if (!e.contains("eval_loss")) continue;
      std::vector<std::pair<std::string, std::string>> row = {
          {"Training Loss", training_loss},
          {"Epoch", e.contains("epoch") ? maybe_round(e["epoch"]) : "None"},
          {"Step", e.contains("step") ? maybe_round(e["step"]) : "None"},
          {"Validation Loss", maybe_round(e["eval_loss"])}};
      rows->push_back(std::move(row));
    }
  }
  std::vector<std::pair<std::string, std::string>> results;
  bool has_results = false;
  for (size_t i = history.size(); i-- > 1;) {  // HF's `if idx > 0`: never the first entry
    if (!history[i].contains("eval_loss")) continue;
    has_results = true;
    for (const auto& [key, value] : history[i].items()) {
      const std::string bare = key.rfind("eval_", 0) == 0 ? key.substr(5) : key;
      if (bare == "runtime" || bare == "samples_per_second" || bare == "steps_per_second" || bare == "epoch" ||
          bare == "step")
        continue;
      results.emplace_back(capitalized_words(bare), maybe_round(value));
    }
    break;
  }
  // HF writes the results in the entry's insertion order (eval_loss first); json sorts keys, and
  // among HF's keys only eval_loss remains.

  std::string md = "---\nlibrary_name: transformers\nlicense: other\n";
  if (!card.finetuned_from.empty()) md += "base_model: " + yaml_scalar(card.finetuned_from) + "\n";
  md += "tags:\n- llama-factory\n- full\n- generated_from_trainer\n";
  md += "model-index:\n- name: " + yaml_scalar(card.model_name) + "\n  results: []\n---\n";
  md +=
      "\n<!-- This model card has been generated automatically according to the information the Trainer had access "
      "to. You\nshould probably proofread and complete it, then remove this comment. -->\n";
  md += "\n# " + card.model_name + "\n\n";
  md += card.finetuned_from.empty()
            ? "This model was trained from scratch on "
            : fmt::format("This model is a fine-tuned version of [{0}](https://huggingface.co/{0}) on ",
                          card.finetuned_from);
  const auto& ds = card.datasets;
  if (ds.empty()) {
    md += "an unknown dataset.";
  } else if (ds.size() == 1) {
    md += "the " + ds[0] + " dataset.";
  } else {
    for (size_t i = 0; i + 1 < ds.size(); ++i) md += (i ? ", the " : "the ") + ds[i];
    md += " and the " + ds.back() + " datasets.";
  }
  if (has_results) {
    md += "\nIt achieves the following results on the evaluation set:\n";
    for (size_t i = 0; i < results.size(); ++i) {
      md += (i ? "\n- " : "- ") + results[i].first + ": " + results[i].second;
    }
  }
  md += "\n";
  md += "\n## Model description\n\nMore information needed\n";
  md += "\n## Intended uses & limitations\n\nMore information needed\n";
  md += "\n## Training and evaluation data\n\nMore information needed\n";
  md += "\n## Training procedure\n";
  md += "\n### Training hyperparameters\n";
  md += "\nThe following hyperparameters were used during training:\n";
  for (size_t i = 0; i < card.hyperparameters.size(); ++i) {
    md += (i ? "\n- " : "- ") + card.hyperparameters[i].first + ": " + card.hyperparameters[i].second;
  }
  md += "\n";
  if (rows) {
    md += "\n### Training results\n\n";
    if (!rows->empty()) {
      // make_markdown_table: columns as wide as their widest cell, centred markers.
      std::vector<size_t> widths;
      for (const auto& [name, value] : rows->front()) widths.push_back(name.size());
      for (const auto& row : *rows) {
        for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].second.size());
      }
      const auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t c = 0; c < cells.size(); ++c)
          s += "| " + cells[c] + std::string(widths[c] - cells[c].size() + 1, ' ');
        return s + "|\n";
      };
      std::vector<std::string> names;
      for (const auto& [name, value] : rows->front()) names.push_back(name);
      md += line(names);
      for (const size_t w : widths) md += "|:" + std::string(w, '-') + ":";
      md += "|\n";
      for (const auto& row : *rows) {
        std::vector<std::string> cells;
        for (const auto& [name, value] : row) cells.push_back(value);
        md += line(cells);
      }
    }
    md += "\n";
  }
  md += "\n### Framework versions\n\n";
  for (const auto& v : card.framework_versions) md += "- " + v + "\n";
  return md;
}

std::vector<std::pair<std::string, std::string>> card_hyperparameters(const PretrainConfig& c, int world_size) {
  // transformers' extract_hyperparameters_from_trainer, in its order.
  std::vector<std::pair<std::string, std::string>> h = {
      {"learning_rate", python_float(c.learning_rate)},
      {"train_batch_size", std::to_string(c.per_device_train_batch_size)},
      {"eval_batch_size", std::to_string(c.per_device_eval_batch_size)},
      {"seed", std::to_string(c.seed)}};
  if (world_size > 1) {
    h.emplace_back("distributed_type", "multi-GPU");
    h.emplace_back("num_devices", std::to_string(world_size));
  }
  if (c.gradient_accumulation_steps > 1) {
    h.emplace_back("gradient_accumulation_steps", std::to_string(c.gradient_accumulation_steps));
  }
  const int64_t total_train = c.per_device_train_batch_size * world_size * c.gradient_accumulation_steps;
  if (total_train != c.per_device_train_batch_size)
    h.emplace_back("total_train_batch_size", std::to_string(total_train));
  const int64_t total_eval = c.per_device_eval_batch_size * world_size;
  if (total_eval != c.per_device_eval_batch_size) h.emplace_back("total_eval_batch_size", std::to_string(total_eval));
  // kiln's AdamW is torch's fused kernel (at::_fused_adamw_): HF's adamw_torch_fused.
  h.emplace_back("optimizer",
                 fmt::format("Use OptimizerNames.ADAMW_TORCH_FUSED with betas=({},{}) and epsilon={} and "
                             "optimizer_args=No additional optimizer arguments",
                             python_float(c.adam_beta1), python_float(c.adam_beta2), python_float(c.adam_epsilon)));
  h.emplace_back("lr_scheduler_type", c.lr_scheduler_type);
  // transformers 5.6 folds a given warmup_ratio into warmup_steps (a float below 1 is a ratio) and
  // writes args.warmup_steps when it is not 0 (modelcard.py:573-574): an int as written, else a float.
  if (const double w = c.hf_warmup_steps(); w != 0) {
    const bool written_int = !(c.warmup_ratio_given || c.warmup_ratio > 0) && w == std::floor(w);
    h.emplace_back("lr_scheduler_warmup_steps",
                   written_int ? std::to_string(static_cast<int64_t>(w)) : python_float(w));
  }
  if (c.max_steps > 0) {
    h.emplace_back("training_steps", std::to_string(c.max_steps));
  } else {
    h.emplace_back("num_epochs", python_float(c.num_train_epochs));
  }
  if (c.fp16) h.emplace_back("mixed_precision_training", "Native AMP");
  return h;
}

std::string trainer_state_text(const HfTrainerState& s) {
  // nlohmann's objects keep their keys sorted, as json.dumps(sort_keys=True).
  const json j = {{"best_global_step", nullptr},
                  {"best_metric", nullptr},
                  {"best_model_checkpoint", nullptr},
                  {"epoch", s.epoch},
                  {"eval_steps", s.eval_steps},
                  {"global_step", s.global_step},
                  {"is_hyper_param_search", false},
                  {"is_local_process_zero", true},
                  {"is_world_process_zero", true},
                  {"log_history", s.log_history},
                  {"logging_steps", s.logging_steps},
                  {"max_steps", s.max_steps},
                  {"num_input_tokens_seen", 0},
                  {"num_train_epochs", s.num_train_epochs},
                  {"save_steps", s.save_steps},
                  // TrainerControl as Trainer._save_checkpoint records it; its save of a resumed run
                  // looks the entry up and fails without it.
                  {"stateful_callbacks",
                   {{"TrainerControl",
                     {{"args",
                       {{"should_epoch_stop", false},
                        {"should_evaluate", false},
                        {"should_log", false},
                        {"should_save", true},
                        {"should_training_stop", s.global_step >= s.max_steps}}},
                      {"attributes", json::object()}}}}},
                  {"total_flos", s.total_flos},
                  {"train_batch_size", s.train_batch_size},
                  {"trial_name", nullptr},
                  {"trial_params", nullptr}};
  return j.dump(2) + "\n";
}

void save_metrics(const std::string& output_dir, const std::string& split, const json& metrics) {
  const fs::path dir(output_dir);
  io::write_file_atomic((dir / fmt::format("{}_results.json", split)).string(), metrics.dump(4));
  const fs::path all = dir / "all_results.json";
  json merged = json::object();
  if (std::ifstream in(all); in) {
    try {
      merged = json::parse(in);
    } catch (const json::exception&) {
      merged = json::object();  // an unreadable earlier file is replaced, as HF would fail to
    }
    if (!merged.is_object()) merged = json::object();
  }
  merged.update(metrics);
  io::write_file_atomic(all.string(), merged.dump(4));
}

std::string default_logging_dir(const std::string& output_dir) {
  if (auto dir = env::string("TENSORBOARD_LOGGING_DIR")) {  // transformers' variable
    if (dir->rfind("~/", 0) == 0) {
      if (const auto home = env::raw("HOME")) *dir = *home + dir->substr(1);
    }
    return *dir;
  }
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &local);
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  return (fs::path(output_dir) / "runs" / fmt::format("{}_{}", stamp, host)).string();
}

std::vector<std::pair<std::string, float>> tensorboard_scalars(const json& entry) {
  std::vector<std::pair<std::string, float>> out;
  for (const auto& [key, value] : entry.items()) {
    if (key == "step" || !value.is_number()) continue;
    const std::string tag = key.rfind("eval_", 0) == 0 ? "eval/" + key.substr(5) : "train/" + key;
    out.emplace_back(tag, value.get<float>());
  }
  return out;
}

}  // namespace kiln::train
