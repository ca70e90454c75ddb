// Typed reading of YAML mappings with errors that name the file, the key and the value.
//
// Every config struct in kiln (model, pretrain, profile) is filled through a ConfigReader: it
// reads one key at a time into a typed field that already holds its default, remembers which
// keys it consumed, and `finish()` rejects the rest, so a typo is an error rather than a silently
// ignored setting. Internal to the library (pulls in yaml-cpp); public headers stay YAML-free.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace kiln::config {

// Thrown for any bad configuration; what() reads "<source>: <key>: <problem>".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Need { kOptional, kRequired };

class ConfigReader {
 public:
  // `source` names where the mapping came from (a file path or "preset 'tiny'") for messages;
  // `prefix` is the dotted path of a nested mapping ("rope_scaling.").
  ConfigReader(YAML::Node map, std::string source, std::string prefix = "");

  static ConfigReader from_file(const std::string& path);
  static ConfigReader from_string(const std::string& text, const std::string& source);

  bool has(std::string_view key) const;
  // True when the key is present with an explicit null (`key: null` / `key: ~`).
  bool is_null(std::string_view key) const;

  // Each read leaves `out` untouched when the key is absent (and optional).
  void read(std::string_view key, int64_t& out, Need need = Need::kOptional);
  void read(std::string_view key, double& out, Need need = Need::kOptional);
  void read(std::string_view key, bool& out, Need need = Need::kOptional);
  void read(std::string_view key, std::string& out, Need need = Need::kOptional);
  // A list: a YAML sequence of scalars, or one scalar of comma-separated items ("16,64", as a
  // command line writes it); each integer as read() reads one. An empty sequence reads as empty.
  void read(std::string_view key, std::vector<int64_t>& out, Need need = Need::kOptional);
  void read(std::string_view key, std::vector<std::string>& out, Need need = Need::kOptional);

  // LLaMA-Factory's comma-separated keys (dataset, eval_dataset, interleave_probs) may be written
  // as a YAML list too (its split_arg takes either): a list of scalars at `key` becomes the one
  // string "a,b", read like the written-out form. Anything else is left for the read to judge.
  void join_list(std::string_view key);
  // Any value as text: a scalar as written, a list joined with ',', a mapping as "{...}";
  // nullopt when absent or null. Marks the key as consumed.
  std::optional<std::string> read_text(std::string_view key);

  // A nested mapping; its keys count as consumed here and are checked by its own finish().
  ConfigReader child(std::string_view key);
  // Marks a key as known without reading it (a key handled elsewhere).
  void accept(std::string_view key);

  // Rejects every key that was not read or accepted; `hint` ends the message (where the keys are listed).
  void finish(const std::string& hint = "") const;

  [[noreturn]] void fail(std::string_view key, const std::string& problem) const;
  const std::string& source() const { return source_; }
  std::string qualified(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  // The scalar at `key`; nullopt when absent or null (and optional).
  std::optional<YAML::Node> lookup(std::string_view key, Need need, const char* expected);
  // The items of a list key (see read); nullopt when absent or null (and optional).
  std::optional<std::vector<std::string>> list_items(std::string_view key, Need need, const char* expected);

  YAML::Node map_;
  std::string source_;
  std::string prefix_;
  std::vector<std::string> consumed_;
};

// Formats a config error the way every kiln config error reads.
std::string config_message(const std::string& source, const std::string& key, const std::string& problem);

}  // namespace kiln::config
