// Bytes as tokens: ids 0..255 are the bytes, then BOS, EOS and PAD. No training, no files, any
// input (also invalid UTF-8) round-trips exactly; used by the embedded default corpus and tests.
#pragma once

#include "kiln/data/tokenizer.h"

namespace kiln::data {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256, kEos = 257, kPad = 258, kVocabSize = 259;
  void encode_into(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens = false) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  uint64_t fingerprint() const override;
  std::string name() const override { return "byte"; }
};

}  // namespace kiln::data
