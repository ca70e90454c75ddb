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

// Length of the longest valid UTF-8 prefix of `text`.
size_t valid_utf8_prefix(std::string_view text);

// `text` itself when it is valid UTF-8; otherwise a copy in `scratch` with every maximal
// ill-formed subpart replaced by U+FFFD (EF BF BD), and a view of it.
std::string_view replace_invalid_utf8(std::string_view text, std::string& scratch);

}  // namespace kiln::data
