// Mutations of valid input files for the fuzz tests (tests/fuzz/test_fuzz_inputs.cpp): each keeps a
// note of what it changed, so that a test can require the rejection to name that field.
#pragma once

#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::test {

struct Mutation {
  std::string text;
  std::string kind;  // "number", "type", "delete", "bytes", "cut", "yaml-value", "yaml-line"
  std::string key;   // the object key whose value was changed or deleted ("" when none is known)
};

inline const std::vector<std::string>& hostile_values() {
  static const std::vector<std::string> v = {"-1",
                                             "18446744073709551616",
                                             "1000000000000",
                                             "4294967295",
                                             "2147483648",
                                             "1.5",
                                             "null",
                                             "\"x\"",
                                             "[]",
                                             "{}",
                                             "true",
                                             "0",
                                             "-9223372036854775808",
                                             "1e400",
                                             "\"\"",
                                             "-0.5"};
  return v;
}

// A JSON document mutated one of five ways: a number replaced by a hostile value, a value replaced
// by one of another type, a key deleted, bytes flipped, or the text cut short.
inline Mutation mutate_json(const std::string& valid, std::mt19937& rng) {
  Mutation m{valid, "", ""};
  const auto& hostile = hostile_values();
  const int kind = static_cast<int>(rng() % 5);
  if (kind == 0 || kind == 1 || kind == 2) {
    nlohmann::json j = nlohmann::json::parse(valid);
    struct Slot {
      nlohmann::json* parent;
      std::string key;  // object member name, or "" for an array element
      size_t index;
    };
    std::vector<Slot> slots;
    std::function<void(nlohmann::json&)> walk = [&](nlohmann::json& n) {
      if (n.is_object()) {
        for (auto it = n.begin(); it != n.end(); ++it) {
          slots.push_back({&n, it.key(), 0});
          walk(it.value());
        }
      } else if (n.is_array()) {
        for (size_t i = 0; i < n.size(); ++i) {
          slots.push_back({&n, "", i});
          walk(n[i]);
        }
      }
    };
    walk(j);
    if (!slots.empty()) {
      // Prefer a number for kind 0, any slot otherwise.
      std::vector<size_t> pick;
      for (size_t i = 0; i < slots.size(); ++i) {
        const nlohmann::json& v =
            slots[i].key.empty() ? (*slots[i].parent)[slots[i].index] : (*slots[i].parent)[slots[i].key];
        if (kind != 0 || v.is_number()) pick.push_back(i);
      }
      if (pick.empty()) pick.push_back(rng() % slots.size());
      const Slot s = slots[pick[rng() % pick.size()]];
      // The nearest object key above an array element names the field.
      m.key = s.key;
      if (kind == 2 && !s.key.empty()) {
        s.parent->erase(s.key);
        m.kind = "delete";
      } else {
        nlohmann::json v = nlohmann::json::parse(hostile[rng() % hostile.size()], nullptr, false);
        if (v.is_discarded()) v = nullptr;
        (s.key.empty() ? (*s.parent)[s.index] : (*s.parent)[s.key]) = v;
        m.kind = kind == 0 ? "number" : "type";
      }
      m.text = j.dump(1);
      return m;
    }
  }
  if (kind == 3 || valid.empty()) {
    m.kind = "bytes";
    for (int k = 0; k < 3 && !m.text.empty(); ++k) m.text[rng() % m.text.size()] = static_cast<char>(rng() % 256);
  } else {
    m.kind = "cut";
    m.text.resize(rng() % m.text.size());
  }
  return m;
}

// Bytes of a binary file mutated: flipped bytes, a zeroed block, or the file cut short.
inline Mutation mutate_bytes(const std::string& valid, std::mt19937& rng) {
  Mutation m{valid, "bytes", ""};
  const int kind = static_cast<int>(rng() % 3);
  if (valid.empty()) return m;
  if (kind == 0) {
    for (int k = 0; k < 1 + static_cast<int>(rng() % 8); ++k)
      m.text[rng() % m.text.size()] ^= static_cast<char>(1 + rng() % 255);
  } else if (kind == 1) {
    const size_t at = rng() % m.text.size(), n = std::min<size_t>(1 + rng() % 64, m.text.size() - at);
    std::fill(m.text.begin() + static_cast<std::ptrdiff_t>(at), m.text.begin() + static_cast<std::ptrdiff_t>(at + n),
              '\0');
  } else {
    m.kind = "cut";
    m.text.resize(rng() % m.text.size());
  }
  return m;
}

// A YAML document mutated by line: a value replaced by a hostile one, a line deleted, duplicated
// or mis-indented, bytes flipped, or the text cut short.
inline Mutation mutate_yaml(const std::string& valid, std::mt19937& rng) {
  static const std::vector<std::string> values = {
      "-1",   "abc",    "1e400",  "[]",   "{}",   "null", "~",     "99999999999999999999",
      "\"\"", "[1, 2]", "{a: 1}", "true", "0x10", ".nan", "-.inf", "'"};
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= valid.size()) {
    const size_t end = valid.find('\n', start);
    lines.push_back(valid.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  std::vector<size_t> keyed;
  static const std::regex key_line(R"(^(\s*)([A-Za-z_][A-Za-z0-9_.]*):(\s*)(.*)$)");
  for (size_t i = 0; i < lines.size(); ++i) {
    if (std::regex_match(lines[i], key_line)) keyed.push_back(i);
  }
  Mutation m{valid, "", ""};
  const int kind = static_cast<int>(rng() % 5);
  auto join = [&] {
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) out += lines[i] + (i + 1 < lines.size() ? "\n" : "");
    return out;
  };
  if (!keyed.empty() && kind <= 2) {
    const size_t i = keyed[rng() % keyed.size()];
    std::smatch sm;
    std::regex_match(lines[i], sm, key_line);
    m.key = sm[2];
    if (kind == 0) {
      lines[i] = std::string(sm[1]) + m.key + ": " + values[rng() % values.size()];
      m.kind = "yaml-value";
    } else if (kind == 1) {
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), lines[i]);  // the key twice
      m.kind = "yaml-line";
    } else {
      lines[i] = "   " + lines[i];  // indented under the line above
      m.kind = "yaml-line";
    }
    m.text = join();
    return m;
  }
  if (kind == 3 && !valid.empty()) {
    m.kind = "bytes";
    for (int k = 0; k < 3; ++k) m.text[rng() % m.text.size()] = static_cast<char>(rng() % 256);
  } else if (!valid.empty()) {
    m.kind = "cut";
    m.text.resize(rng() % m.text.size());
  }
  return m;
}

}  // namespace kiln::test
