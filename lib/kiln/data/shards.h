// Token shards: the on-disk form of a tokenized corpus (docs/data.md has the byte layout).
//
// A shard set is a folder with meta.json and, per split ("train", "val"), shards
//   <split>_<NNNNN>.bin  flat little-endian uint16 or uint32 token ids (dtype from the vocab size)
//   <split>_<NNNNN>.idx  uint64 document start offsets within the shard, documents + 1 entries
// Every document ends with EOS and never spans two shards. meta.json records the tokenizer's
// fingerprint, the dtype, token and document counts and an XXH64 checksum of every file.
// Writers produce <file>.tmp and rename it only once complete, and meta.json is written last, so
// a crash never leaves a shard that looks whole; readers refuse any disagreement with meta.json.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kiln::data {

enum class TokenDtype { kUint16, kUint32 };
TokenDtype dtype_for_vocab(int64_t vocab_size);  // uint16 when every id fits
const char* dtype_name(TokenDtype dtype);
int64_t dtype_bytes(TokenDtype dtype);

struct ShardInfo {
  std::string file, index;  // names relative to the shard folder
  int64_t tokens = 0, documents = 0;
  uint64_t checksum = 0, index_checksum = 0;  // XXH64 of the .bin and .idx files
};

struct SplitInfo {
  std::string name;
  int64_t tokens = 0, documents = 0;
  std::vector<ShardInfo> shards;
};

struct ShardSetMeta {
  static constexpr int kVersion = 1;
  std::string tokenizer;  // "byte" or the tokenizer.json path it was built with
  uint64_t tokenizer_fingerprint = 0;
  int64_t vocab_size = 0;
  int32_t bos_id = -1, eos_id = -1;
  // Whether each document starts with the tokenizer's template (its BOS): kiln-tokenize's
  // --add-special-tokens; false by default, as LLaMA-Factory's pretraining (and in sets written
  // before the field existed). kiln-generate and kiln-eval follow it for models trained on the set.
  bool add_special_tokens = false;
  TokenDtype dtype = TokenDtype::kUint16;
  std::vector<SplitInfo> splits;
  std::string to_json() const;
  static ShardSetMeta from_json(const std::string& text, const std::string& path);  // errors name path and key
};

// Writes one split's shards into a folder, `shard_tokens` tokens per shard (at document ends).
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, TokenDtype dtype, int64_t shard_tokens);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void add_document(std::span<const int32_t> ids);  // ids including the trailing EOS
  SplitInfo finish();                               // closes the last shard

 private:
  void close_shard();
  std::string dir_, split_;
  TokenDtype dtype_;
  int64_t shard_tokens_;
  SplitInfo info_;
  std::FILE* file_ = nullptr;
  std::string tmp_path_;
  std::vector<uint64_t> starts_;
  int64_t tokens_in_shard_ = 0;
  std::vector<char> buffer_;
};

// What kiln-pretrain records in every checkpoint it writes (kiln_data.json): the shard set the
// model was trained on and that set's tokenizer, so that kiln-generate and kiln-eval can encode
// text as the model saw it (with or without the template's BOS) and find the tokenizer.
struct DataRecord {
  static constexpr const char* kFile = "kiln_data.json";
  std::string dataset_dir;
  std::string tokenizer;  // "byte" or the tokenizer.json path the shards were made with
  uint64_t tokenizer_fingerprint = 0;
  int64_t vocab_size = 0;
  int32_t bos_id = -1, eos_id = -1;
  bool add_special_tokens = false;
  static DataRecord of(const std::string& dataset_dir, const ShardSetMeta& meta);
  std::string to_json() const;
  // nullopt when the folder has no kiln_data.json (a checkpoint not written by kiln-pretrain);
  // errors name the file and the key.
  static std::optional<DataRecord> read(const std::string& checkpoint_dir);
};

// meta.json written atomically (temp file + rename).
void write_shard_meta(const std::string& dir, const ShardSetMeta& meta);

// One split of an opened shard set: its shards memory-mapped and seen as one token stream.
class TokenSplit {
 public:
  int64_t num_tokens() const { return tokens_; }
  int64_t num_documents() const { return static_cast<int64_t>(doc_starts_.size()) - 1; }
  TokenDtype dtype() const { return dtype_; }
  // out[i] = token at start + i of the concatenated stream; [start, start + count) must be in range.
  void copy_tokens(int64_t start, int64_t count, int64_t* out) const;
  // Global start offsets of the documents, num_documents() + 1 entries (the last = num_tokens()).
  const std::vector<int64_t>& document_starts() const { return doc_starts_; }
  int64_t document_of(int64_t position) const;  // index of the document holding the token
  // The largest token id in the split (-1 when it is empty), found when the set is opened, so a
  // model or tokenizer too small for the data is refused before any batch is read.
  int64_t max_token_id() const { return max_token_id_; }
  struct Mapped;  // a read-only memory map of one file

 private:
  friend class TokenShards;
  std::vector<std::shared_ptr<Mapped>> shards_;
  std::vector<int64_t> shard_starts_;  // global offset of each shard, + total
  std::vector<int64_t> doc_starts_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  int64_t tokens_ = 0;
  int64_t max_token_id_ = -1;
};

struct OpenShardsOptions {
  std::optional<uint64_t> expected_fingerprint;  // refuse shards made with another tokenizer
  bool verify_checksums = true;                  // hash every file (XXH64 runs at several GB/s)
};

class TokenShards {
 public:
  // Opens and validates <dir>/meta.json and every shard it lists: file names stay inside <dir>,
  // sizes, checksums and document offsets agree with meta.json, and every token id is below
  // meta.json's vocab_size.
  static std::shared_ptr<TokenShards> open(const std::string& dir, const OpenShardsOptions& options = {});
  const ShardSetMeta& meta() const { return meta_; }
  bool has_split(const std::string& name) const;
  std::shared_ptr<const TokenSplit> split(const std::string& name) const;  // throws if absent
  const std::string& dir() const { return dir_; }
  int64_t max_token_id() const;  // over all splits
  // Throws, naming the shard folder, the largest id and `vocab_size` and `what` (e.g. "the model's
  // vocab_size (checkpoint/config.json)"), when a token id of any split is >= vocab_size.
  void check_ids_below(int64_t vocab_size, const std::string& what) const;

 private:
  std::string dir_;
  ShardSetMeta meta_;
  std::vector<std::pair<std::string, std::shared_ptr<TokenSplit>>> splits_;
};

}  // namespace kiln::data
