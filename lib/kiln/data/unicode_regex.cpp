// Pattern rewriting and the PCRE2 class probe: see unicode_regex.h.
#include "kiln/data/unicode_regex.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <pcre2.h>

#include "kiln/data/utf8.h"

namespace kiln::data {

namespace {

#include "kiln/data/unicode_tables.inc"

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;

// A set of code points as a bitmap over 0..U+10FFFF.
struct CodePointSet {
  std::vector<uint64_t> bits = std::vector<uint64_t>((kMaxCodePoint + 64) / 64, 0);
  void add(char32_t first, char32_t last) {
    for (char32_t c = first; c <= last; ++c) bits[c >> 6] |= uint64_t{1} << (c & 63);
  }
  bool has(char32_t c) const { return (bits[c >> 6] >> (c & 63)) & 1; }
  std::vector<CodePointRange> ranges() const {  // surrogates never included
    std::vector<CodePointRange> out;
    for (char32_t c = 0; c <= kMaxCodePoint; ++c) {
      if (!has(c) || (c >= kSurrogateFirst && c <= kSurrogateLast)) continue;
      if (!out.empty() && out.back().last + 1 == c) {
        out.back().last = c;
      } else {
        out.push_back({c, c});
      }
    }
    return out;
  }
};

const UnicodeTable* find_table(std::string_view name) {
  if (name == "L&") name = "LC";
  for (const UnicodeTable& t : kUnicodeTables) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Decodes the valid UTF-8 sequence at s[i]; sets its length.
char32_t decode_at(std::string_view s, size_t i, size_t& len) {
  len = utf8_sequence_length(static_cast<unsigned char>(s[i]));
  return utf8_code_point(s, i, len);
}

// Every code point but the surrogates, in order, as UTF-8.
const std::string& all_code_points() {
  static const std::string text = [] {
    std::string s;
    s.reserve(4400000);
    for (char32_t c = 0; c <= kMaxCodePoint; ++c) {
      if (c < kSurrogateFirst || c > kSurrogateLast) append_utf8(s, c);
    }
    return s;
  }();
  return text;
}

// The code points that the system's PCRE2 puts in `escape` (e.g. "\\p{L}", "\\s"), found by
// matching escape++ over every code point. Cached per escape.
const CodePointSet& pcre2_members(const std::string& escape) {
  static std::mutex mutex;
  static std::map<std::string, CodePointSet> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(escape); it != cache.end()) return it->second;
  // Possessive: a run of 40,000 CJK letters needs no backtracking stack (a plain + can exhaust
  // the JIT stack and end the scan early).
  const std::string probe = escape + "++";
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(probe.data()), probe.size(), PCRE2_UTF | PCRE2_UCP,
                                   &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument(fmt::format("'{}': {}", escape, reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  pcre2_match_data* match = pcre2_match_data_create(1, nullptr);
  CodePointSet set;
  const std::string& subject = all_code_points();
  size_t start = 0;
  while (start < subject.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                               PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(match);
      pcre2_code_free(code);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw std::runtime_error(fmt::format("probing '{}': {}", escape, reinterpret_cast<char*>(message)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    size_t i = ov[0];
    while (i < ov[1]) {
      size_t len = 0;
      const char32_t c = decode_at(subject, i, len);
      set.add(c, c);
      i += len;
    }
    start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
  }
  pcre2_match_data_free(match);
  pcre2_code_free(code);
  return cache.emplace(escape, std::move(set)).first->second;
}

void append_hex(std::string& out, char32_t c) {
  out += fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(c));
}

// Class items (no brackets) for `ranges`, or for their complement over all code points.
std::string class_items(const UnicodeRange* ranges, size_t n, bool complement) {
  std::vector<CodePointRange> list;
  if (!complement) {
    for (size_t k = 0; k < n; ++k) {
      if (ranges[k].first > kSurrogateLast || ranges[k].last < kSurrogateFirst)
        list.push_back({ranges[k].first, ranges[k].last});
    }
  } else {
    char32_t next = 0;
    const auto add_gap = [&](char32_t a, char32_t b) {  // [a, b] minus the surrogates
      if (a > b) return;
      if (b < kSurrogateFirst || a > kSurrogateLast) {
        list.push_back({a, b});
        return;
      }
      if (a < kSurrogateFirst) list.push_back({a, kSurrogateFirst - 1});
      if (b > kSurrogateLast) list.push_back({kSurrogateLast + 1, b});
    };
    for (size_t k = 0; k < n; ++k) {
      if (ranges[k].first > 0) add_gap(next, ranges[k].first - 1);
      next = ranges[k].last + 1;
    }
    if (next <= kMaxCodePoint) add_gap(next, kMaxCodePoint);
  }
  std::string out;
  for (const CodePointRange& r : list) {
    append_hex(out, r.first);
    if (r.last != r.first) {
      out += '-';
      append_hex(out, r.last);
    }
  }
  return out;
}

// One class escape found in the pattern: its table and sense.
struct Escape {
  const UnicodeTable* table = nullptr;
  bool negated = false;
  std::string probe;  // the positive form as PCRE2 reads it, for pcre2_members()
  size_t length = 0;  // characters of the pattern it spans
};

// Parses the escape at pattern[i] == '\\'; table == nullptr when it is not one kiln translates.
Escape parse_escape(const std::string& p, size_t i) {
  Escape e;
  if (i + 1 >= p.size()) return e;
  const char c = p[i + 1];
  if (c == 's' || c == 'S') {
    e.table = find_table("White_Space");
    e.negated = c == 'S';
    e.probe = "\\s";
    e.length = 2;
  } else if (c == 'd' || c == 'D') {
    e.table = find_table("Nd");
    e.negated = c == 'D';
    e.probe = "\\d";
    e.length = 2;
  } else if (c == 'p' || c == 'P') {
    std::string name;
    size_t length = 0;
    if (i + 2 < p.size() && p[i + 2] == '{') {
      const size_t close = p.find('}', i + 3);
      if (close == std::string::npos) return e;
      name = p.substr(i + 3, close - i - 3);
      length = close + 1 - i;
    } else if (i + 2 < p.size()) {
      name = p.substr(i + 2, 1);
      length = 3;
    } else {
      return e;
    }
    bool negated = c == 'P';
    if (!name.empty() && name[0] == '^') {
      negated = !negated;
      name.erase(0, 1);
    }
    e.table = find_table(name);
    if (!e.table || name == "White_Space") return Escape{};
    e.negated = negated;
    e.probe = "\\p{" + name + "}";
    e.length = length;
  }
  return e;
}

}  // namespace

UnicodeExactPattern unicode_exact_pattern(const std::string& p) {
  UnicodeExactPattern out;
  std::string exact;
  bool changed = false, in_class = false;
  size_t class_start = 0;
  // Case-insensitive scopes: explicit ranges under (?i) would also match the other case of each
  // range's letters, which \p{Lu} does not; escapes there are left to PCRE2's tables.
  std::vector<bool> caseless{false};
  CodePointSet differ;
  bool any_differ = false;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 < p.size() && p[i + 1] == 'Q') {  // \Q...\E: literal
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string::npos ? p.size() : end + 2;
        exact.append(p, i, stop - i);
        i = stop;
        continue;
      }
      const Escape e = parse_escape(p, i);
      // \s and \d hold no cased letters: ranges match the same under (?i).
      if (e.table && (!caseless.back() || e.probe == "\\s" || e.probe == "\\d")) {
        const CodePointSet& mine = pcre2_members(e.probe);
        CodePointSet table;
        for (size_t k = 0; k < e.table->size; ++k) table.add(e.table->ranges[k].first, e.table->ranges[k].last);
        for (size_t w = 0; w < table.bits.size(); ++w) {
          const uint64_t x = table.bits[w] ^ mine.bits[w];
          differ.bits[w] |= x;
          any_differ = any_differ || x != 0;
        }
        const std::string items = class_items(e.table->ranges, e.table->size, e.negated);
        exact += in_class ? items : "[" + items + "]";
        changed = true;
        i += e.length;
        continue;
      }
      exact.append(p, i, std::min<size_t>(2, p.size() - i));
      i += 2;
      continue;
    }
    if (in_class) {
      // A ']' right after '[' or '[^' is a literal; POSIX [:name:] items are copied whole.
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
        const size_t end = p.find(":]", i + 2);
        const size_t stop = end == std::string::npos ? i + 1 : end + 2;
        exact.append(p, i, stop - i);
        i = stop;
        continue;
      }
      if (c == ']' && i > class_start) in_class = false;
      exact += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      class_start = i + 1;
      if (class_start < p.size() && p[class_start] == '^') ++class_start;
      exact += c;
      ++i;
      continue;
    }
    if (c == '(') {
      // (?flags) changes the current scope; (?flags: opens a scope with them; ( opens one as is.
      bool scope = caseless.back();
      size_t j = i + 1;
      if (j < p.size() && p[j] == '?') {
        size_t k = j + 1;
        bool on = true, flag_group = false, ci = scope;
        while (k < p.size() && std::string_view("imsxnUJ-^").find(p[k]) != std::string_view::npos) {
          if (p[k] == '-') on = false;
          if (p[k] == '^') ci = false;
          if (p[k] == 'i') ci = on;
          ++k;
          flag_group = true;
        }
        if (flag_group && k < p.size() && p[k] == ')') {
          caseless.back() = ci;
          exact.append(p, i, k + 1 - i);
          i = k + 1;
          continue;
        }
        if (flag_group && k < p.size() && p[k] == ':') scope = ci;
      }
      caseless.push_back(scope);
    } else if (c == ')' && caseless.size() > 1) {
      caseless.pop_back();
    }
    exact += c;
    ++i;
  }
  if (changed) out.exact = std::move(exact);
  if (any_differ) out.differ = differ.ranges();
  return out;
}

bool contains_code_point_in(std::string_view text, const std::vector<CodePointRange>& ranges) {
  if (ranges.empty()) return false;
  // Bytes that cannot start a code point >= the first range are skipped without decoding.
  const char32_t lowest = ranges.front().first;
  const unsigned char threshold = lowest >= 0x10000 ? 0xF0 : lowest >= 0x800 ? 0xE0 : lowest >= 0x80 ? 0xC0 : 0x00;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    if (s[i] < threshold) {
      ++i;
      continue;
    }
    size_t len = 0;
    const char32_t c = decode_at(text, i, len);
    i += len;
    const auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                                     [](char32_t v, const CodePointRange& r) { return v < r.first; });
    if (it != ranges.begin() && c <= std::prev(it)->last) return true;
  }
  return false;
}

const char* unicode_tables_version() {
  return kUnicodeTablesVersion;
}

}  // namespace kiln::data
