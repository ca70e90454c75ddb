// One key table per settings struct, read from a YAML file and from `--key value` command-line
// overrides alike: the mechanism of every kiln program that takes settings (kiln-pretrain's
// PretrainConfig, kiln-profile's sweep, plan and explain).
//
// A table maps each snake_case key to its field (and a line of --help). The file is read by a
// ConfigReader over the table; the command line is split into (key, value) pairs by
// parse_overrides and read by a second ConfigReader (source "command line") over the same table,
// so a value means the same and fails with the same words in both. The rules, for every program:
//   - unknown key: an error naming the source (the file, or "command line") and the key;
//   - repeated key: in a file an error (yaml.h); on the command line the last one wins (argparse's
//     rule: a wrapper can append overrides to a base command; a negative flag such as
//     --no-add-bos is the same key, so `--add-bos --no-add-bos` is add_bos false), and the command
//     line wins over the file. The one exception a program may declare: a list key whose repeats
//     add up (Spelling::accumulate: kiln-tokenize's `--input a --input b` is `--input a,b`);
//   - contradictory keys: the struct's validate() refuses them, naming the source and a key.
// The other programs (kiln-eval, kiln-generate, kiln-hf, kiln-tokenize, kiln-bench, kiln-smoke)
// take `--config FILE` and their keys through parse_command_line and read_settings below.
// Internal to the library (pulls in yaml-cpp through yaml.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/config/yaml.h"

namespace kiln::config {

template <class C>
using Field = std::variant<int64_t C::*, double C::*, bool C::*, std::string C::*, std::vector<int64_t> C::*,
                           std::vector<std::string> C::*>;

template <class C>
struct Key {
  Key(std::string name_, Field<C> field_, std::string help_ = {})
      : name(std::move(name_)), field(field_), help(std::move(help_)) {}
  std::string name;
  Field<C> field;
  std::string help;  // one line for --help; "" where a program lists the names only
};

template <class C>
using KeyTable = std::vector<Key<C>>;

// Reads every key of `table` that `r` holds into `c` (an absent key leaves its default).
// Does not call r.finish(): a caller may read further keys first.
template <class C>
void read_keys(ConfigReader& r, C& c, const KeyTable<C>& table) {
  for (const Key<C>& key : table) {
    std::visit([&](auto member) { r.read(key.name, c.*member); }, key.field);
  }
}

// The keys of `table` named in `names`, in that order; throws std::logic_error for a name the
// table lacks (a programming error: one table names another's keys).
template <class C>
KeyTable<C> select_keys(const KeyTable<C>& table, const std::vector<std::string>& names) {
  KeyTable<C> out;
  for (const std::string& name : names) {
    bool found = false;
    for (const Key<C>& key : table) {
      if (key.name == name) {
        out.push_back(key);
        found = true;
      }
    }
    if (!found) throw std::logic_error("select_keys: no key '" + name + "' in the table");
  }
  return out;
}

// A key as --help lists it: "--cutoff_len N,N,..." and its line.
struct KeyDoc {
  std::string name;
  std::string value;  // "N", "X", "TEXT", "N,N,...", "A,B,...", "[true|false]"
  std::string help;
};

template <class C>
std::vector<KeyDoc> key_docs(const KeyTable<C>& table) {
  std::vector<KeyDoc> out;
  for (const Key<C>& key : table) {
    const char* value = std::visit(
        [](auto member) -> const char* {
          using T = std::remove_reference_t<decltype(std::declval<C>().*member)>;
          if constexpr (std::is_same_v<T, int64_t>) return "N";
          if constexpr (std::is_same_v<T, double>) return "X";
          if constexpr (std::is_same_v<T, bool>) return "[true|false]";
          if constexpr (std::is_same_v<T, std::string>) return "TEXT";
          if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "N,N,...";
          return "A,B,...";
        },
        key.field);
    out.push_back({key.name, value, key.help});
  }
  return out;
}

// How a program's command line may write a key besides `--key value` and `--key=value`.
struct Spelling {
  // A '-' in a key reads as '_': --cutoff-len is cutoff_len.
  bool kebab_case = false;
  // Other names of a key (without the dashes): {"batch-size", "per_device_train_batch_size"}.
  // With a value, the alias stands alone and sets the key to it: {"no-overlap", "ddp_overlap", "false"}.
  struct Alias {
    std::string name, key;
    std::optional<std::string> value;
  };
  std::vector<Alias> aliases;
  // Keys that may stand alone, meaning true (the boolean keys): `--counters` is `--counters true`.
  // Such a key takes the next argument as its value only when it does not start with "--".
  std::vector<std::string> switches;
  // List keys whose repeats add up (`--input a --input b` is `--input a,b`); every other key
  // repeated: the last wins.
  std::vector<std::string> accumulate;
  // The table's keys, when given: a key not among them reads as a switch (it takes the next
  // argument only when that does not start with "--"), so that a misspelled flag (`--grad` for
  // `--grads`) is reported by the reader as an unknown key rather than as a key missing its
  // value or one taking the next key as its value.
  std::vector<std::string> keys;
};

// The switches of a table: its boolean keys.
template <class C>
std::vector<std::string> boolean_keys(const KeyTable<C>& table) {
  std::vector<std::string> out;
  for (const Key<C>& key : table) {
    if (std::holds_alternative<bool C::*>(key.field)) out.push_back(key.name);
  }
  return out;
}

// Splits "--key value" / "--key=value" arguments into (key, value) pairs, in order, each key
// written as its table key (`spelling`'s aliases and kebab case resolved); throws ConfigError
// naming a dangling "--key" or a stray positional argument.
std::vector<std::pair<std::string, std::string>> parse_overrides(const std::vector<std::string>& args,
                                                                 const Spelling& spelling = {});

// A reader over command-line overrides: one mapping of the pairs, the last of a repeated key
// winning; `source` names it in errors.
ConfigReader overrides_reader(const std::vector<std::pair<std::string, std::string>>& overrides,
                              const std::string& source = "command line");

// A program's command line, split: `--config FILE` (a YAML file of the same keys; given twice, the
// last wins), whether -h or --help is anywhere in it (then nothing else is parsed), and the rest
// as parse_overrides reads it.
struct CommandLine {
  std::string config_path;
  bool help = false;
  std::vector<std::pair<std::string, std::string>> overrides;
};
CommandLine parse_command_line(const std::vector<std::string>& args, const Spelling& spelling = {});

// Where each given key of a program's settings came from: the file's path or "command line" (the
// command line's winning). A check after the reading names the key's source through fail().
class KeySources {
 public:
  explicit KeySources(std::string fallback = "command line") : fallback_(std::move(fallback)) {}
  void set(const std::string& key, const std::string& source) { sources_[key] = source; }
  bool given(const std::string& key) const { return sources_.count(key) > 0; }
  // The key's source; for a key given nowhere (a missing one, a default), the last source read.
  const std::string& source(const std::string& key) const;
  // The given keys, sorted.
  std::vector<std::string> keys() const;
  // Throws ConfigError "<source>: key '<key>': <problem>".
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;

 private:
  std::map<std::string, std::string> sources_;
  std::string fallback_;
};

// Reads `table` into `c` from the YAML file `path` (none when empty), then from the command
// line's `overrides` (winning over the file); each source's unknown keys are refused, `hint`
// ending the message (where --help lists the keys). Returns where each given key came from.
template <class C>
KeySources read_settings(C& c, const KeyTable<C>& table, const std::string& path,
                         const std::vector<std::pair<std::string, std::string>>& overrides, const std::string& hint) {
  KeySources sources(path.empty() || !overrides.empty() ? "command line" : path);
  auto read = [&](ConfigReader& r) {
    read_keys(r, c, table);
    r.finish(hint);
    for (const Key<C>& key : table) {
      if (r.has(key.name)) sources.set(key.name, r.source());
    }
  };
  if (!path.empty()) {
    ConfigReader file = ConfigReader::from_file(path);
    read(file);
  }
  ConfigReader cli = overrides_reader(overrides);
  read(cli);
  return sources;
}

// A program's modes (kiln-hf's commands, kiln-tokenize's --decode) each read some of its keys: one
// given to another mode would be silently ignored, so it is refused, naming its source: "<source>:
// key 'k': does not apply to <mode> (<hint>)".
void check_keys_apply(const KeySources& given, const std::vector<std::string>& keys, const std::string& mode,
                      const std::string& hint);

// The --help list of `keys`: one "  --key VALUE  help" line each (the help wrapped at `width`).
std::string keys_help(const std::vector<KeyDoc>& keys, size_t width = 100);

}  // namespace kiln::config
