// The tokenizer interface the data pipeline sees. Torch-free (plain vectors of int32 ids) so that
// tokenization is fast, threadable and testable without LibTorch. Two implementations:
// ByteTokenizer (256 bytes + BOS/EOS/PAD, for the embedded corpus and tests) and HfTokenizer
// (byte-level or SentencePiece BPE from a Hugging Face tokenizer.json, id-for-id equal to HF
// `tokenizers`).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` to `out`. add_special_tokens = HF's flag of the same name (a BOS
  // from the post-processor template); the pretraining pipeline passes false and appends EOS
  // itself, as LLaMA-Factory's pretraining stage does.
  virtual void encode_into(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens = false) const = 0;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const {
    std::vector<int32_t> out;
    encode_into(text, out, add_special_tokens);
    return out;
  }
  // Bytes of the ids; special tokens are kept unless skip_special_tokens. Byte-level tokenizers:
  // the tokens' bytes, not necessarily valid UTF-8 (a token can end inside a character).
  // SentencePiece-BPE: HF's decode, through the tokenizer.json's decoder chain (valid UTF-8).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const = 0;
  virtual int64_t vocab_size() const = 0;  // largest id + 1
  virtual int32_t bos_id() const = 0;      // -1 when the tokenizer has none
  virtual int32_t eos_id() const = 0;      // always defined: every document ends with it
  // Identity of the tokenizer's definition (type, vocabulary, merges, special ids): shards record
  // it and refuse to be read with another tokenizer.
  virtual uint64_t fingerprint() const = 0;
  virtual std::string name() const = 0;  // "byte" or the tokenizer.json path
};

// "byte" -> ByteTokenizer; a path to a tokenizer.json, or a folder holding one -> HfTokenizer.
// eos_token overrides the EOS token of an HF tokenizer (by content, e.g. "<|endoftext|>").
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec, const std::string& eos_token = "");

}  // namespace kiln::data
