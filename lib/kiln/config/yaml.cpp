// See yaml.h. yaml-cpp's own exceptions (bad syntax, bad conversion) are caught here and rethrown
// as ConfigError with the source and key, so callers only ever handle one error type.
#include "kiln/config/yaml.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

namespace kiln::config {

std::string config_message(const std::string& source, const std::string& key, const std::string& problem) {
  if (key.empty()) return fmt::format("{}: {}", source, problem);
  return fmt::format("{}: key '{}': {}", source, key, problem);
}

ConfigReader::ConfigReader(YAML::Node map, std::string source, std::string prefix)
    : map_(std::move(map)), source_(std::move(source)), prefix_(std::move(prefix)) {
  if (map_.IsNull()) map_ = YAML::Node(YAML::NodeType::Map);  // an empty file is an empty mapping
  if (!map_.IsMap()) {
    throw ConfigError(config_message(source_, prefix_.empty() ? "" : prefix_.substr(0, prefix_.size() - 1),
                                     "expected a mapping of key: value"));
  }
  // yaml-cpp keeps the first of two equal keys without a word; a repeated key is a mistake.
  std::vector<std::string> seen;
  for (const auto& kv : map_) {
    const std::string key = kv.first.as<std::string>();
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) fail(key, "appears more than once");
    seen.push_back(key);
  }
}

ConfigReader ConfigReader::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{}: cannot open config file", path));
  std::stringstream text;
  text << in.rdbuf();
  return from_string(text.str(), path);
}

ConfigReader ConfigReader::from_string(const std::string& text, const std::string& source) {
  try {
    return ConfigReader(YAML::Load(text), source);
  } catch (const YAML::Exception& e) {
    throw ConfigError(
        fmt::format("{}: line {}, column {}: invalid YAML: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

bool ConfigReader::has(std::string_view key) const {
  return static_cast<bool>(map_[std::string(key)]);
}

bool ConfigReader::is_null(std::string_view key) const {
  const YAML::Node node = map_[std::string(key)];
  return node && node.IsNull();
}

void ConfigReader::accept(std::string_view key) {
  consumed_.emplace_back(key);
}

std::optional<YAML::Node> ConfigReader::lookup(std::string_view key, Need need, const char* expected) {
  consumed_.emplace_back(key);
  YAML::Node node = std::as_const(map_)[std::string(key)];  // const: non-const [] inserts the key
  if (!node || node.IsNull()) {
    if (need == Need::kRequired) fail(key, fmt::format("missing required key (expected {})", expected));
    return std::nullopt;
  }
  if (!node.IsScalar()) fail(key, fmt::format("expected {}, got a {}", expected, node.IsMap() ? "mapping" : "list"));
  return node;
}

namespace {

// 1000, 1_000 and 1e3 (integral) read as 1000; 1.5 and "abc" as nothing.
std::optional<int64_t> parse_integer(const std::string& text) {
  std::string digits;
  std::copy_if(text.begin(), text.end(), std::back_inserter(digits), [](char c) { return c != '_'; });
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, 10);
  if (!digits.empty() && end && *end == '\0' && errno == 0) return v;
  const double d = std::strtod(digits.c_str(), &end);
  if (!digits.empty() && end && *end == '\0' && std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) {
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::string trimmed(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace

void ConfigReader::read(std::string_view key, int64_t& out, Need need) {
  const auto node = lookup(key, need, "an integer");
  if (!node) return;
  const std::string text = node->Scalar();
  if (const auto v = parse_integer(text)) {
    out = *v;
    return;
  }
  fail(key, fmt::format("expected an integer, got '{}'", text));
}

void ConfigReader::read(std::string_view key, double& out, Need need) {
  const auto node = lookup(key, need, "a number");
  if (!node) return;
  const std::string text = node->Scalar();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || !end || *end != '\0' || errno == ERANGE || std::isnan(v)) {
    fail(key, fmt::format("expected a number, got '{}'", text));
  }
  out = v;
}

void ConfigReader::read(std::string_view key, bool& out, Need need) {
  const auto node = lookup(key, need, "true or false");
  if (!node) return;
  const std::string text = node->Scalar();
  if (text == "true" || text == "True" || text == "TRUE") {
    out = true;
  } else if (text == "false" || text == "False" || text == "FALSE") {
    out = false;
  } else {
    fail(key, fmt::format("expected true or false, got '{}'", text));
  }
}

void ConfigReader::read(std::string_view key, std::string& out, Need need) {
  const auto node = lookup(key, need, "a string");
  if (!node) return;
  out = node->Scalar();
}

std::optional<std::vector<std::string>> ConfigReader::list_items(std::string_view key, Need need,
                                                                 const char* expected) {
  consumed_.emplace_back(key);
  const YAML::Node node = std::as_const(map_)[std::string(key)];
  if (!node || node.IsNull()) {
    if (need == Need::kRequired) fail(key, fmt::format("missing required key (expected {})", expected));
    return std::nullopt;
  }
  if (node.IsMap()) fail(key, fmt::format("expected {}, got a mapping", expected));
  std::vector<std::string> items;
  if (node.IsSequence()) {
    for (const auto& item : node) {
      if (!item.IsScalar()) fail(key, fmt::format("expected {}, got a nested list or mapping", expected));
      items.push_back(trimmed(item.Scalar()));
    }
    return items;
  }
  std::stringstream ss(node.Scalar());
  std::string item;
  while (std::getline(ss, item, ',')) items.push_back(trimmed(item));
  if (!node.Scalar().empty() && node.Scalar().back() == ',') items.emplace_back();
  return items;
}

void ConfigReader::read(std::string_view key, std::vector<int64_t>& out, Need need) {
  const char* expected = "a list of integers (a YAML list, or 16,64)";
  const auto items = list_items(key, need, expected);
  if (!items) return;
  std::vector<int64_t> values;
  for (const std::string& item : *items) {
    const auto v = parse_integer(item);
    if (!v) {
      const YAML::Node node = std::as_const(map_)[std::string(key)];
      fail(key, fmt::format("expected {}, got '{}'{}", expected, item,
                            node.IsScalar() ? fmt::format(" in '{}'", node.Scalar()) : std::string()));
    }
    values.push_back(*v);
  }
  out = std::move(values);
}

void ConfigReader::read(std::string_view key, std::vector<std::string>& out, Need need) {
  if (const auto items = list_items(key, need, "a list (a YAML list, or a,b)")) out = *items;
}

void ConfigReader::join_list(std::string_view key) {
  const YAML::Node node = std::as_const(map_)[std::string(key)];
  if (!node || !node.IsSequence()) return;
  std::string joined;
  for (const auto& item : node) {
    if (!item.IsScalar()) return;
    joined += (joined.empty() ? "" : ",") + item.Scalar();
  }
  map_[std::string(key)] = joined;
}

std::optional<std::string> ConfigReader::read_text(std::string_view key) {
  consumed_.emplace_back(key);
  const YAML::Node node = std::as_const(map_)[std::string(key)];
  if (!node || node.IsNull()) return std::nullopt;
  if (node.IsScalar()) return node.Scalar();
  if (node.IsMap()) return std::string("{...}");
  std::string out;
  for (const auto& item : node) {
    if (!out.empty()) out += ",";
    out += item.IsScalar() ? item.Scalar() : std::string("...");
  }
  return out;
}

ConfigReader ConfigReader::child(std::string_view key) {
  consumed_.emplace_back(key);
  YAML::Node node = std::as_const(map_)[std::string(key)];
  if (node && !node.IsNull() && !node.IsMap()) fail(key, "expected a mapping of key: value");
  return ConfigReader(node ? node : YAML::Node(YAML::NodeType::Map), source_, qualified(key) + ".");
}

void ConfigReader::finish(const std::string& hint) const {
  for (const auto& kv : map_) {
    const std::string key = kv.first.as<std::string>();
    if (std::find(consumed_.begin(), consumed_.end(), key) == consumed_.end()) {
      fail(key,
           "unknown key (misspelled, or not supported by this version of kiln)" + (hint.empty() ? "" : "; " + hint));
    }
  }
}

void ConfigReader::fail(std::string_view key, const std::string& problem) const {
  throw ConfigError(config_message(source_, qualified(key), problem));
}

}  // namespace kiln::config
