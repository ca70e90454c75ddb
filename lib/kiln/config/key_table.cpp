// See key_table.h.
#include "kiln/config/key_table.h"

#include <algorithm>

#include <fmt/format.h>

namespace kiln::config {

namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

std::vector<std::pair<std::string, std::string>> parse_overrides(const std::vector<std::string>& args,
                                                                 const Spelling& spelling) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      throw ConfigError(fmt::format("command line: unexpected argument '{}' (expected --key value)", a));
    }
    const auto eq = a.find('=');
    std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    std::optional<std::string> value;
    if (eq != std::string::npos) value = a.substr(eq + 1);
    const auto alias = std::find_if(spelling.aliases.begin(), spelling.aliases.end(),
                                    [&](const Spelling::Alias& x) { return x.name == key; });
    if (alias != spelling.aliases.end() && alias->value) {  // a flag: --no-overlap
      if (value) throw ConfigError(fmt::format("command line: {} takes no value", a.substr(0, eq)));
      out.emplace_back(alias->key, *alias->value);
      continue;
    }
    if (alias != spelling.aliases.end()) {
      key = alias->key;
    } else if (spelling.kebab_case) {
      std::replace(key.begin(), key.end(), '-', '_');
    }
    if (!value) {
      const bool has_next = i + 1 < args.size();
      const bool unknown = !spelling.keys.empty() && !contains(spelling.keys, key);
      if ((contains(spelling.switches, key) || unknown) && (!has_next || args[i + 1].rfind("--", 0) == 0)) {
        value = "true";
      } else if (has_next) {
        value = args[++i];
      } else {
        throw ConfigError(fmt::format("command line: key '{}': missing value", key));
      }
    }
    const auto earlier = std::find_if(out.begin(), out.end(), [&](const auto& kv) { return kv.first == key; });
    if (earlier != out.end() && contains(spelling.accumulate, key)) {  // --input a --input b
      earlier->second += "," + *value;
      continue;
    }
    out.emplace_back(key, *value);
  }
  return out;
}

CommandLine parse_command_line(const std::vector<std::string>& args, const Spelling& spelling) {
  CommandLine line;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-h" || args[i] == "--help") {
      line.help = true;
      return line;
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config") {
      if (i + 1 == args.size()) throw ConfigError("command line: key 'config': missing value (a YAML file)");
      line.config_path = args[++i];
    } else if (args[i].rfind("--config=", 0) == 0) {
      line.config_path = args[i].substr(9);
    } else {
      rest.push_back(args[i]);
    }
  }
  line.overrides = parse_overrides(rest, spelling);
  return line;
}

const std::string& KeySources::source(const std::string& key) const {
  const auto it = sources_.find(key);
  return it == sources_.end() ? fallback_ : it->second;
}

std::vector<std::string> KeySources::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, source] : sources_) out.push_back(key);
  return out;
}

void check_keys_apply(const KeySources& given, const std::vector<std::string>& keys, const std::string& mode,
                      const std::string& hint) {
  for (const std::string& key : given.keys()) {
    if (!contains(keys, key)) given.fail(key, fmt::format("does not apply to {} ({})", mode, hint));
  }
}

void KeySources::fail(const std::string& key, const std::string& problem) const {
  throw ConfigError(config_message(source(key), key, problem));
}

ConfigReader overrides_reader(const std::vector<std::pair<std::string, std::string>>& overrides,
                              const std::string& source) {
  YAML::Node map(YAML::NodeType::Map);
  for (const auto& [key, value] : overrides) map[key] = value;  // a repeated key: the last wins
  return ConfigReader(map, source);
}

std::string keys_help(const std::vector<KeyDoc>& keys, size_t width) {
  size_t column = 0;
  for (const KeyDoc& k : keys) column = std::max(column, k.name.size() + k.value.size() + 5);
  column = std::min<size_t>(column, 40);
  std::string out;
  for (const KeyDoc& k : keys) {
    std::string head = fmt::format("  --{} {}", k.name, k.value);
    std::string line = head;
    if (head.size() + 1 > column) {
      out += head + "\n";
      line.clear();
    }
    // Wrap the help at word boundaries, each continuation under the first.
    std::string text = k.help;
    while (!text.empty()) {
      line.resize(column, ' ');
      const size_t room = width > column ? width - column : 40;
      size_t cut = text.size();
      if (cut > room) {
        cut = text.rfind(' ', room);
        if (cut == std::string::npos || cut == 0) cut = room;
      }
      line += text.substr(0, cut);
      out += line + "\n";
      line.clear();
      const size_t next = text.find_first_not_of(' ', cut);
      text = next == std::string::npos ? std::string() : text.substr(next);
    }
    if (!line.empty()) out += line + "\n";
  }
  return out;
}

}  // namespace kiln::config
