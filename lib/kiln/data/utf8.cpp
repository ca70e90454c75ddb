// Well-formed UTF-8 per Unicode Table 3-7; see utf8.h for why replacement follows maximal subparts.
#include "kiln/data/utf8.h"

#include <cstdint>

namespace kiln::data {

namespace {

// Length of the well-formed sequence at text[i] (1..4), or 0 if ill-formed; `subpart` receives the
// length of the maximal subpart (>= 1) to replace by one U+FFFD when it is ill-formed.
size_t sequence_length(std::string_view text, size_t i, size_t& subpart) {
  const auto at = [&](size_t k) -> int { return i + k < text.size() ? static_cast<uint8_t>(text[i + k]) : -1; };
  const int b0 = at(0);
  subpart = 1;
  if (b0 < 0x80) return 1;
  int need, lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k <= need; ++k) {
    const int b = at(k);
    const int l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      subpart = k;
      return 0;
    }
  }
  return static_cast<size_t>(need + 1);
}

}  // namespace

size_t valid_utf8_prefix(std::string_view text) {
  size_t i = 0, subpart = 0;
  while (i < text.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= text.size()) {
      uint64_t w;
      __builtin_memcpy(&w, text.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const size_t n = sequence_length(text, i, subpart);
    if (n == 0) return i;
    i += n;
  }
  return text.size();
}

std::string_view replace_invalid_utf8(std::string_view text, std::string& scratch) {
  size_t i = valid_utf8_prefix(text);
  if (i == text.size()) return text;
  scratch.assign(text.substr(0, i));
  size_t subpart = 0;
  while (i < text.size()) {
    const size_t n = sequence_length(text, i, subpart);
    if (n == 0) {
      scratch += "\xEF\xBF\xBD";
      i += subpart;
    } else {
      scratch.append(text.substr(i, n));
      i += n;
    }
  }
  return scratch;
}

}  // namespace kiln::data
