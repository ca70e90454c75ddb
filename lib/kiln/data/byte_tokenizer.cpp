// ByteTokenizer, and load_tokenizer() which picks the implementation from a spec string.
#include "kiln/data/byte_tokenizer.h"

#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/data/hash.h"
#include "kiln/data/hf_tokenizer.h"

namespace kiln::data {

std::string hex64(uint64_t value) {
  return fmt::format("{:016x}", value);
}

void ByteTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens) const {
  out.reserve(out.size() + text.size() + 1);
  if (add_special_tokens) out.push_back(kBos);
  for (const char c : text) out.push_back(static_cast<uint8_t>(c));
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  out.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (id >= 256 && id < kVocabSize) {
      if (!skip_special_tokens) out += id == kBos ? "<bos>" : id == kEos ? "<eos>" : "<pad>";
    } else {
      throw std::out_of_range(
          fmt::format("ByteTokenizer::decode: id {} outside the vocabulary [0, {})", id, kVocabSize));
    }
  }
  return out;
}

uint64_t ByteTokenizer::fingerprint() const {
  return xxh64("kiln-byte-tokenizer-v1 bos=256 eos=257 pad=258");
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec, const std::string& eos_token) {
  if (spec == "byte") {
    if (!eos_token.empty()) throw std::invalid_argument("the byte tokenizer has a fixed EOS; do not pass an EOS token");
    return std::make_unique<ByteTokenizer>();
  }
  std::filesystem::path path(spec);
  if (std::filesystem::is_directory(path)) path /= "tokenizer.json";
  if (!std::filesystem::is_regular_file(path)) {
    throw std::invalid_argument(fmt::format("tokenizer '{}': not 'byte' and no such tokenizer.json", spec));
  }
  return std::make_unique<HfTokenizer>(path.string(), eos_token);
}

}  // namespace kiln::data
