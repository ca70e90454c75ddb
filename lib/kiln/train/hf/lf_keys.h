// The keys of LLaMA-Factory's `stage: pt` / `finetuning_type: full` configs and of the HF
// TrainingArguments such runs use that PretrainConfig has no field of its own for. Each is judged
// with its value: acted on (it changes the config as the two projects define it), accepted
// without effect (one info line says why it cannot change a kiln run), or refused (it asks for
// something kiln does not do: the error names the key and what kiln supports). A key neither
// PretrainConfig nor this table knows stays an "unknown key" error (docs/training.md, the table).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/train/pretrain_config.h"

namespace kiln::config {
class ConfigReader;
}

namespace kiln::train {

enum class LfKeyClass { kActed, kNoEffect, kRefused };

struct LfKeyVerdict {
  LfKeyClass cls;
  std::string message;  // the info line (no effect; "" = silent) or the error (refused)
};

// nullopt for a key this table does not know. `value` as written in the YAML (a list joined by ',').
std::optional<LfKeyVerdict> classify_lf_key(std::string_view key, std::string_view value);

// Every key of the table, in documentation order.
const std::vector<std::string>& lf_keys();

// Every key kiln-pretrain reads, as a JSON object {key: "acted" | "accepted" | "refused"}, keys
// sorted (kiln-pretrain --list-keys; tests/python/test_lf_key_audit.py): a PretrainConfig key,
// or a table key kiln acts on at some value, is "acted"; a table key accepted at some value
// (with its line, or silently at its LLaMA-Factory default) "accepted"; one refused at every
// value "refused".
std::string key_classes_json();

// Reads each table key present in `r`: a refused one throws config::ConfigError naming the
// source and key, an accepted one logs its info line, an acted one changes `c`.
void read_lf_keys(config::ConfigReader& r, PretrainConfig& c);

// "key: why" for each key in `given` (set by the file or the command line) that has no effect on
// this config: the LLaMA-Factory data keys without dataset:, buffer_size and
// dataloader_num_workers without streaming (preprocessing_num_workers and data_seed with it),
// eval_steps (and val_size) without
// HF's evaluation strategy where HF's rules apply, auto_fit_memory without auto_fit,
// logging_dir without tensorboard, a schedule's keys under another schedule, warmup_steps beside
// warmup_ratio (transformers 5.6: the ratio replaces it). load_pretrain_config logs each as a
// warning naming the source.
std::vector<std::string> keys_without_effect(const PretrainConfig& c, const std::set<std::string>& given);

}  // namespace kiln::train
