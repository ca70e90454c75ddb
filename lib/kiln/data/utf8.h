// UTF-8 validation with replacement. Byte-level BPE tokenizers (HF `tokenizers`) operate on
// Rust strings, which are valid UTF-8 by construction, so text that is not valid UTF-8 has no HF
// encoding. kiln's HfTokenizer defines one: every ill-formed sequence is replaced by U+FFFD,
// one per "maximal subpart" (Unicode 15, section 3.9, U+FFFD substitution of maximal subparts),
// which is exactly what Rust's String::from_utf8_lossy and Python's bytes.decode("utf-8",
// errors="replace") do. So kiln(bytes) == HF(bytes.decode("utf-8", "replace")).
#pragma once

#include <string>
#include <string_view>

namespace kiln::data {

// Decoding text already known to be valid UTF-8 (the tokenizer's hot loops): the length of the
// sequence a lead byte starts (1 for ASCII and, defensively, for a stray continuation byte) and
// the code point of the n-byte sequence at s[i].
inline size_t utf8_sequence_length(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
inline char32_t utf8_code_point(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (n) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

// Length of the longest valid UTF-8 prefix of `text`.
size_t valid_utf8_prefix(std::string_view text);

// `text` itself when it is valid UTF-8; otherwise a copy in `scratch` with every maximal
// ill-formed subpart replaced by U+FFFD (EF BF BD), and a view of it.
std::string_view replace_invalid_utf8(std::string_view text, std::string& scratch);

}  // namespace kiln::data
