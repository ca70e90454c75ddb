// Environment variables: the one reader every variable goes through, one parse rule per kind, and
// the overrides that tests set in the environment's place.
//
// kiln's own variables (KILN_*) are listed, each with its kind and what it overrides, in the one
// table of docs/architecture.md, "Environment variables". Their rules:
//   - unset and empty are the same: not set (nullopt), and the default applies;
//   - flag:    1, true, yes, on / 0, false, no, off (any case);
//   - integer: a decimal integer, the whole value, within [min, max];
//   - choice:  one of the listed words, exactly;
//   - string:  the value as it is.
// A value that does not parse throws std::invalid_argument naming the variable, the value and
// what it takes: "KILN_CPU_CE_LOOP=maybe: expected 1 or 0 (true/false, yes/no, on/off)".
// Values are read when asked for (never cached), so a variable and an override act at once.
//
// Other programs' variables (torchrun's RANK, Slurm's SLURM_*, OMP_NUM_THREADS, HOME, ...) keep
// their own protocol: raw() gives the value exactly as set ("" included) and the caller parses it
// as that protocol says (dist/env.cpp).
//
// Overrides: a test, or a benchmark that compares two paths, sets a variable for the process with
// Override (scoped) or set_override instead of setenv. Every reader here consults the overrides
// before the process environment, so a test forcing a path and a user setting the variable take
// the same code path. An override of nullopt reads as unset, whatever the environment says.
//
// Header-only and without LibTorch: the CPU emulation of the CUDA kernels (kernels/emulation*.h)
// is compiled into test programs that link nothing else.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace kiln::env {

namespace detail {
struct Overrides {
  std::mutex mutex;
  std::map<std::string, std::optional<std::string>, std::less<>> values;
  std::atomic<int> count{0};  // values.size(): the readers' fast path when no test set any
};
inline Overrides& overrides() {
  static Overrides o;
  return o;
}
// {true, value} when `name` is overridden (value nullopt: as unset), {false, -} otherwise.
inline std::pair<bool, std::optional<std::string>> find_override(std::string_view name) {
  Overrides& o = overrides();
  if (o.count.load(std::memory_order_acquire) == 0) return {false, std::nullopt};
  const std::lock_guard<std::mutex> lock(o.mutex);
  const auto it = o.values.find(name);
  if (it == o.values.end()) return {false, std::nullopt};
  return {true, it->second};
}
[[noreturn]] inline void fail(const char* name, const std::string& value, const std::string& expected) {
  throw std::invalid_argument(std::string(name) + "=" + value + ": expected " + expected);
}
}  // namespace detail

// The value of `name` exactly as set (an override, else the process environment), "" included;
// nullopt when unset. For other programs' variables, whose protocol says what a value means.
inline std::optional<std::string> raw(const char* name) {
  if (auto [overridden, value] = detail::find_override(name); overridden) return value;
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// kiln's rule: the value, or nullopt when unset or empty.
inline std::optional<std::string> string(const char* name) {
  std::optional<std::string> v = raw(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

// 1, true, yes, on -> true; 0, false, no, off -> false (any case); nullopt when unset or empty.
inline std::optional<bool> flag(const char* name) {
  const std::optional<std::string> v = string(name);
  if (!v) return std::nullopt;
  std::string lower = *v;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  detail::fail(name, *v, "1 or 0 (true/false, yes/no, on/off)");
}

// A decimal integer in [min, max], the whole value; nullopt when unset or empty. `meaning`, when
// given, follows the range in the error ("a compute capability times ten").
inline std::optional<int64_t> integer(const char* name, int64_t min, int64_t max, std::string_view meaning = {}) {
  const std::optional<std::string> v = string(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v->c_str(), &end, 10);
  const bool whole = end != v->c_str() && *end == '\0' && !std::isspace(static_cast<unsigned char>((*v)[0]));
  if (!whole || errno == ERANGE || n < min || n > max) {
    std::string expected = "an integer from " + std::to_string(min) + " to " + std::to_string(max);
    if (!meaning.empty()) expected += " (" + std::string(meaning) + ")";
    detail::fail(name, *v, expected);
  }
  return static_cast<int64_t>(n);
}

// One of `words`, exactly; nullopt when unset or empty.
inline std::optional<std::string> choice(const char* name, std::initializer_list<std::string_view> words) {
  std::optional<std::string> v = string(name);
  if (!v) return std::nullopt;
  if (std::find(words.begin(), words.end(), std::string_view(*v)) != words.end()) return v;
  std::string list;
  size_t i = 0;
  for (const std::string_view w : words) {
    list += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + std::string(w);
    ++i;
  }
  detail::fail(name, *v, list);
}

// Sets `name` for this process until cleared: every reader above returns `value` (nullopt: as
// unset) instead of the environment's. For the process-wide testing hooks (ops::testing::force_*).
inline void set_override(const char* name, std::optional<std::string> value) {
  detail::Overrides& o = detail::overrides();
  const std::lock_guard<std::mutex> lock(o.mutex);
  o.values.insert_or_assign(std::string(name), std::move(value));
  o.count.store(static_cast<int>(o.values.size()), std::memory_order_release);
}

// Back to the process environment for `name`.
inline void clear_override(const char* name) {
  detail::Overrides& o = detail::overrides();
  const std::lock_guard<std::mutex> lock(o.mutex);
  if (const auto it = o.values.find(std::string_view(name)); it != o.values.end()) o.values.erase(it);
  o.count.store(static_cast<int>(o.values.size()), std::memory_order_release);
}

// set_override for a scope: restores what was there before (an outer override, or none) when
// destroyed, so scopes nest.
class Override {
 public:
  Override(const char* name, std::optional<std::string> value) : name_(name), previous_(detail::find_override(name)) {
    set_override(name, std::move(value));
  }
  ~Override() {
    if (previous_.first) {
      set_override(name_.c_str(), previous_.second);
    } else {
      clear_override(name_.c_str());
    }
  }
  Override(const Override&) = delete;
  Override& operator=(const Override&) = delete;

 private:
  std::string name_;
  std::pair<bool, std::optional<std::string>> previous_;
};

}  // namespace kiln::env
