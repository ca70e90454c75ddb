// Unicode-exact pre-tokenizer patterns (data/unicode_regex.h). References: the Unicode 16.0
// tables themselves (unicode_tables.inc, checked against HF tokenizers code point by code point
// when generated): every rewritten pattern must match exactly the code points its classes hold
// in the tables, in and out of character classes, negated or not; and the system's PCRE2 must be
// found to differ exactly where it does (on Debian 12's 10.42: U+1C8A and U+180E among others).
#include <random>
#include <string>
#include <vector>

#include <pcre2.h>
#include <catch2/catch.hpp>

#include "kiln/data/unicode_regex.h"

namespace tables {
#include <cstddef>

#include "kiln/data/unicode_tables.inc"
}  // namespace tables

using kiln::data::CodePointRange;
using kiln::data::unicode_exact_pattern;

namespace {

bool in_table(const char* name, char32_t c) {
  for (const auto& t : tables::kUnicodeTables) {
    if (std::string(t.name) != name) continue;
    for (size_t k = 0; k < t.size; ++k) {
      if (c >= t.ranges[k].first && c <= t.ranges[k].last) return true;
    }
    return false;
  }
  FAIL("no table " << name);
  return false;
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Whether `pattern` matches the whole one-character subject c.
struct Matcher {
  pcre2_code* code;
  pcre2_match_data* md;
  explicit Matcher(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::string anchored = "^(?:" + pattern + ")$";
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(anchored.data()), anchored.size(), PCRE2_UTF | PCRE2_UCP, &err,
                         &off, nullptr);
    REQUIRE(code != nullptr);
    md = pcre2_match_data_create(1, nullptr);
  }
  ~Matcher() {
    pcre2_match_data_free(md);
    pcre2_code_free(code);
  }
  bool operator()(char32_t c) const {
    const std::string s = utf8(c);
    return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr) >= 0;
  }
};

std::vector<char32_t> sample_code_points() {
  std::vector<char32_t> out = {0x1C8A,  0x1C89,  0xA7CB,  0xA7DC,  0x10D50, 0x10D70, 0x10D4E, 0x105C0, 0x11F04,
                               0x1E4D0, 0x2EBF0, 0x31350, 0x10D40, 0x1CCF0, 0x1D2C0, 0x0897,  0x0CF3,  0x1171E,
                               0x10D6E, 0x1B4E,  0x2427,  0x13439, 0x180E,  0x0378,  0x20,    0x0A,    0x85,
                               0xA0,    0x3000,  'a',     'Z',     '5',     '_',     0x10FFFF};
  for (char32_t c = 0; c < 0x250; ++c) out.push_back(c);
  std::mt19937 rng(16);
  while (out.size() < 6000) {
    const char32_t c = rng() % 0x110000;
    if (c < 0xD800 || c > 0xDFFF) out.push_back(c);
  }
  return out;
}

}  // namespace

TEST_CASE("Unicode-exact patterns match the Unicode 16.0 classes, in and out of character classes", "[data]") {
  CHECK(std::string(kiln::data::unicode_tables_version()) == "16.0.0");
  struct Case {
    std::string pattern;
    std::function<bool(char32_t)> want;
  };
  const auto L = [](char32_t c) { return in_table("L", c); };
  const auto N = [](char32_t c) { return in_table("N", c); };
  const auto S = [](char32_t c) { return in_table("White_Space", c); };
  const std::vector<Case> cases = {
      {R"(\p{L})", L},
      {R"(\pL)", L},
      {R"(\P{L})", [&](char32_t c) { return !L(c); }},
      {R"(\p{^L})", [&](char32_t c) { return !L(c); }},
      {R"(\s)", S},
      {R"(\S)", [&](char32_t c) { return !S(c); }},
      {R"(\d)", [](char32_t c) { return in_table("Nd", c); }},
      {R"([^\s\p{L}\p{N}])", [&](char32_t c) { return !S(c) && !L(c) && !N(c); }},
      {R"([^\r\n\p{L}\p{N}])", [&](char32_t c) { return c != '\r' && c != '\n' && !L(c) && !N(c); }},
      {R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])",
       [](char32_t c) {
         return in_table("Lu", c) || in_table("Lt", c) || in_table("Lm", c) || in_table("Lo", c) || in_table("M", c);
       }},
      {R"([\S_])", [&](char32_t c) { return !S(c) || c == '_'; }},
      {R"((?i)\s)", S},  // \s has no cased letters: translated under (?i) too
  };
  const auto points = sample_code_points();
  for (const Case& k : cases) {
    const auto u = unicode_exact_pattern(k.pattern);
    REQUIRE_FALSE(u.exact.empty());
    const Matcher exact(u.exact);
    int wrong = 0;
    for (const char32_t c : points) {
      if (exact(c) != k.want(c)) {
        if (++wrong <= 3) FAIL_CHECK(k.pattern << " on U+" << std::hex << static_cast<uint32_t>(c));
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("the code points where the system's PCRE2 differs are found, and a text is checked for them", "[data]") {
  const auto u = unicode_exact_pattern(R"(\p{L}+|\s+)");
  const Matcher letter(R"(\p{L})"), space(R"(\s)");
  // Exactly where libpcre2's own classes disagree with the tables (on any libpcre2 version).
  for (const char32_t c : sample_code_points()) {
    const bool differs = letter(c) != in_table("L", c) || space(c) != in_table("White_Space", c);
    bool listed = false;
    for (const CodePointRange& r : u.differ) listed = listed || (c >= r.first && c <= r.last);
    CAPTURE(static_cast<uint32_t>(c));
    CHECK(listed == differs);
  }
  if (!letter(0x1C8A)) {  // a PCRE2 older than Unicode 16 (Debian 12's 10.42 is Unicode 14)
    CHECK(kiln::data::contains_code_point_in("plain ascii and \xd0\xbc\xd0\xb8\xd1\x80 and \xe6\xbc\xa2", u.differ) ==
          false);
    CHECK(kiln::data::contains_code_point_in("\xd0\xbc\xe1\xb2\x8a\xd0\xb8\xd1\x80", u.differ));  // U+1C8A
  }
  CHECK_FALSE(kiln::data::contains_code_point_in("anything", {}));
  // Patterns without translated classes, scripts and (?i) letters are left alone.
  CHECK(unicode_exact_pattern(R"('s|'t| ?[a-z]+)").exact.empty());
  CHECK(unicode_exact_pattern(R"(\p{Han}+)").exact.empty());
  CHECK(unicode_exact_pattern(R"((?i:\p{Lu}))").exact.empty());
  CHECK(unicode_exact_pattern(R"(\Q\p{L}\E)").exact.empty());
  CHECK_FALSE(unicode_exact_pattern(R"((?i:x)\p{Lu})").exact.empty());  // the (?i) scope ended
}
