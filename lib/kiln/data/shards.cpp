// Token shard writing, validation and memory-mapped reading (formats in shards.h, docs/data.md).
#include "kiln/data/shards.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/data/hash.h"
#include "kiln/io/input_file.h"
#include "kiln/io/safetensors.h"

namespace kiln::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

TokenDtype dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDtype::kUint16 : TokenDtype::kUint32;
}
const char* dtype_name(TokenDtype dtype) {
  return dtype == TokenDtype::kUint16 ? "uint16" : "uint32";
}
int64_t dtype_bytes(TokenDtype dtype) {
  return dtype == TokenDtype::kUint16 ? 2 : 4;
}

// A read-only memory map of a whole file (empty files map to nothing).
struct TokenSplit::Mapped {
  std::string path;
  const unsigned char* data = nullptr;
  size_t size = 0;
  explicit Mapped(const std::string& p) : path(p) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(fmt::format("'{}': cannot open: {}", p, std::strerror(errno)));
    struct stat st {};
    ::fstat(fd, &st);
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        ::close(fd);
        throw std::runtime_error(fmt::format("'{}': cannot mmap: {}", p, std::strerror(errno)));
      }
      data = static_cast<const unsigned char*>(m);
    }
    ::close(fd);
  }
  ~Mapped() {
    if (data) ::munmap(const_cast<unsigned char*>(data), size);
  }
};

std::string ShardSetMeta::to_json() const {
  json j;
  j["format"] = "kiln-token-shards";
  j["version"] = kVersion;
  j["tokenizer"] = {{"name", tokenizer},        {"fingerprint", hex64(tokenizer_fingerprint)},
                    {"vocab_size", vocab_size}, {"bos_id", bos_id},
                    {"eos_id", eos_id},         {"add_special_tokens", add_special_tokens}};
  j["dtype"] = dtype_name(dtype);
  j["splits"] = json::object();
  for (const SplitInfo& s : splits) {
    json shards = json::array();
    for (const ShardInfo& sh : s.shards) {
      shards.push_back({{"file", sh.file},
                        {"index", sh.index},
                        {"tokens", sh.tokens},
                        {"documents", sh.documents},
                        {"checksum", "xxh64:" + hex64(sh.checksum)},
                        {"index_checksum", "xxh64:" + hex64(sh.index_checksum)}});
    }
    j["splits"][s.name] = {{"tokens", s.tokens}, {"documents", s.documents}, {"shards", shards}};
  }
  return j.dump(2) + "\n";
}

namespace {

// A shard file name from meta.json: a plain name inside the shard folder, never a path that
// reads elsewhere ("../other/train_00000.bin", "/etc/passwd", "sub/x.bin").
std::string shard_file_name(const json& j, const char* key, const std::string& where) {
  const auto name = j.at(key).get<std::string>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos || name.find('\0') != std::string::npos) {
    throw std::runtime_error(
        fmt::format("{}: {} '{}' is not a file name inside the shard folder (a shard set never "
                    "reads outside its own folder)",
                    where, key, name));
  }
  return name;
}

template <typename T>
int64_t max_of(const unsigned char* data, size_t bytes) {
  const auto* p = reinterpret_cast<const T*>(data);
  const size_t n = bytes / sizeof(T);
  T m = 0;
  for (size_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  return n == 0 ? -1 : static_cast<int64_t>(m);
}

uint64_t parse_checksum(const json& j, const char* key, const std::string& where) {
  const auto s = j.at(key).get<std::string>();
  if (s.rfind("xxh64:", 0) != 0 || s.size() != 22)
    throw std::runtime_error(fmt::format("{}: {} '{}' is not 'xxh64:<16 hex digits>'", where, key, s));
  return std::stoull(s.substr(6), nullptr, 16);
}

}  // namespace

ShardSetMeta ShardSetMeta::from_json(const std::string& text, const std::string& path) {
  ShardSetMeta m;
  std::string where = path;
  try {
    const json j = json::parse(text);
    if (j.value("format", "") != "kiln-token-shards")
      throw std::runtime_error(fmt::format("{}: format is not 'kiln-token-shards'", path));
    if (j.at("version").get<int>() != kVersion)
      throw std::runtime_error(
          fmt::format("{}: version {} is not supported (expected {})", path, j["version"].dump(), kVersion));
    const json& t = j.at("tokenizer");
    m.tokenizer = t.at("name").get<std::string>();
    m.tokenizer_fingerprint = std::stoull(t.at("fingerprint").get<std::string>(), nullptr, 16);
    m.vocab_size = t.at("vocab_size").get<int64_t>();
    m.bos_id = t.at("bos_id").get<int32_t>();
    m.eos_id = t.at("eos_id").get<int32_t>();
    m.add_special_tokens = t.value("add_special_tokens", false);
    const auto dtype = j.at("dtype").get<std::string>();
    if (dtype == "uint16")
      m.dtype = TokenDtype::kUint16;
    else if (dtype == "uint32")
      m.dtype = TokenDtype::kUint32;
    else
      throw std::runtime_error(fmt::format("{}: dtype '{}' is not uint16 or uint32", path, dtype));
    if (m.dtype == TokenDtype::kUint16 && m.vocab_size > 65536)
      throw std::runtime_error(fmt::format("{}: dtype uint16 cannot hold vocab_size {}", path, m.vocab_size));
    for (const auto& [name, s] : j.at("splits").items()) {
      where = fmt::format("{}: splits.{}", path, name);
      SplitInfo info{name, s.at("tokens").get<int64_t>(), s.at("documents").get<int64_t>(), {}};
      size_t k = 0;
      for (const auto& sh : s.at("shards")) {
        const std::string shard_where = fmt::format("{}.shards[{}]", where, k++);
        ShardInfo si;
        si.file = shard_file_name(sh, "file", shard_where);
        si.index = shard_file_name(sh, "index", shard_where);
        si.tokens = sh.at("tokens").get<int64_t>();
        si.documents = sh.at("documents").get<int64_t>();
        si.checksum = parse_checksum(sh, "checksum", where);
        si.index_checksum = parse_checksum(sh, "index_checksum", where);
        info.shards.push_back(si);
      }
      m.splits.push_back(info);
    }
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("{}: malformed shard metadata: {}", where, e.what()));
  }
  return m;
}

DataRecord DataRecord::of(const std::string& dataset_dir, const ShardSetMeta& meta) {
  DataRecord r;
  r.dataset_dir = dataset_dir;
  r.tokenizer = meta.tokenizer;
  r.tokenizer_fingerprint = meta.tokenizer_fingerprint;
  r.vocab_size = meta.vocab_size;
  r.bos_id = meta.bos_id;
  r.eos_id = meta.eos_id;
  r.add_special_tokens = meta.add_special_tokens;
  return r;
}

std::string DataRecord::to_json() const {
  const json j = {{"dataset_dir", dataset_dir},
                  {"tokenizer",
                   {{"name", tokenizer},
                    {"fingerprint", hex64(tokenizer_fingerprint)},
                    {"vocab_size", vocab_size},
                    {"bos_id", bos_id},
                    {"eos_id", eos_id},
                    {"add_special_tokens", add_special_tokens}}}};
  return j.dump(2) + "\n";
}

std::optional<DataRecord> DataRecord::read(const std::string& checkpoint_dir) {
  const fs::path path = fs::path(checkpoint_dir) / kFile;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  const std::string file = path.string();
  const json j = io::read_json_file(file);
  const auto at = [&](const json& obj, const char* key, const std::string& parent = "") -> const json& {
    return io::json_field(obj, key, file, parent);
  };
  DataRecord r;
  r.dataset_dir = io::json_string(at(j, "dataset_dir"), file, "dataset_dir");
  const json& t = at(j, "tokenizer");
  r.tokenizer = io::json_string(at(t, "name", "tokenizer"), file, "tokenizer.name");
  const std::string fingerprint = io::json_string(at(t, "fingerprint", "tokenizer"), file, "tokenizer.fingerprint");
  if (fingerprint.empty() || fingerprint.size() > 16 ||
      fingerprint.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    io::refuse(file, "tokenizer.fingerprint", "up to 16 hex digits", fmt::format("'{}'", fingerprint.substr(0, 40)));
  r.tokenizer_fingerprint = std::stoull(fingerprint, nullptr, 16);
  r.vocab_size = io::json_integer(at(t, "vocab_size", "tokenizer"), file, "tokenizer.vocab_size", 1, INT32_MAX);
  r.bos_id =
      static_cast<int32_t>(io::json_integer(at(t, "bos_id", "tokenizer"), file, "tokenizer.bos_id", -1, INT32_MAX));
  r.eos_id =
      static_cast<int32_t>(io::json_integer(at(t, "eos_id", "tokenizer"), file, "tokenizer.eos_id", -1, INT32_MAX));
  r.add_special_tokens = io::json_bool(at(t, "add_special_tokens", "tokenizer"), file, "tokenizer.add_special_tokens");
  return r;
}

void write_shard_meta(const std::string& dir, const ShardSetMeta& meta) {
  io::write_file_atomic((fs::path(dir) / "meta.json").string(), meta.to_json());
}

ShardWriter::ShardWriter(std::string dir, std::string split, TokenDtype dtype, int64_t shard_tokens)
    : dir_(std::move(dir)), split_(std::move(split)), dtype_(dtype), shard_tokens_(shard_tokens) {
  if (shard_tokens_ <= 0) throw std::invalid_argument("ShardWriter: shard_tokens must be > 0");
  info_.name = split_;
  fs::create_directories(dir_);
}

ShardWriter::~ShardWriter() {
  if (file_) {  // abandoned (an exception): leave no partial shard behind
    std::fclose(file_);
    std::error_code ec;
    fs::remove(tmp_path_, ec);
  }
}

void ShardWriter::add_document(std::span<const int32_t> ids) {
  if (!file_) {
    tmp_path_ = (fs::path(dir_) / fmt::format("{}_{:05}.bin.tmp", split_, info_.shards.size())).string();
    file_ = std::fopen(tmp_path_.c_str(), "wb");
    if (!file_) throw std::runtime_error(fmt::format("'{}': cannot create: {}", tmp_path_, std::strerror(errno)));
    starts_.assign(1, 0);
    tokens_in_shard_ = 0;
  }
  const int64_t width = dtype_bytes(dtype_);
  buffer_.resize(ids.size() * width);
  const uint32_t limit = dtype_ == TokenDtype::kUint16 ? 65535u : 0xFFFFFFFFu;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto v = static_cast<uint32_t>(ids[i]);
    if (ids[i] < 0 || v > limit)
      throw std::out_of_range(fmt::format("token id {} does not fit {}", ids[i], dtype_name(dtype_)));
    if (dtype_ == TokenDtype::kUint16) {
      const auto h = static_cast<uint16_t>(v);
      std::memcpy(buffer_.data() + i * 2, &h, 2);
    } else {
      std::memcpy(buffer_.data() + i * 4, &v, 4);
    }
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size())
    throw std::runtime_error(fmt::format("'{}': write failed: {}", tmp_path_, std::strerror(errno)));
  tokens_in_shard_ += static_cast<int64_t>(ids.size());
  starts_.push_back(static_cast<uint64_t>(tokens_in_shard_));
  if (tokens_in_shard_ >= shard_tokens_) close_shard();
}

void ShardWriter::close_shard() {
  if (!file_) return;
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0)
    throw std::runtime_error(fmt::format("'{}': flush failed: {}", tmp_path_, std::strerror(errno)));
  std::fclose(file_);
  file_ = nullptr;
  ShardInfo sh;
  sh.file = fmt::format("{}_{:05}.bin", split_, info_.shards.size());
  sh.index = fmt::format("{}_{:05}.idx", split_, info_.shards.size());
  sh.tokens = tokens_in_shard_;
  sh.documents = static_cast<int64_t>(starts_.size()) - 1;
  {
    TokenSplit::Mapped mapped(tmp_path_);
    sh.checksum = xxh64(mapped.data, mapped.size);
  }
  const std::string index(reinterpret_cast<const char*>(starts_.data()), starts_.size() * sizeof(uint64_t));
  sh.index_checksum = xxh64(index);
  io::write_file_atomic((fs::path(dir_) / sh.index).string(), index);
  fs::rename(tmp_path_, fs::path(dir_) / sh.file);
  info_.tokens += sh.tokens;
  info_.documents += sh.documents;
  info_.shards.push_back(sh);
}

SplitInfo ShardWriter::finish() {
  close_shard();
  return info_;
}

void TokenSplit::copy_tokens(int64_t start, int64_t count, int64_t* out) const {
  if (start < 0 || count < 0 || start + count > tokens_)
    throw std::out_of_range(
        fmt::format("copy_tokens: [{}, {}) outside the split's {} tokens", start, start + count, tokens_));
  size_t s = std::upper_bound(shard_starts_.begin(), shard_starts_.end(), start) - shard_starts_.begin() - 1;
  while (count > 0) {
    const int64_t offset = start - shard_starts_[s];
    const int64_t n = std::min(count, shard_starts_[s + 1] - start);
    const unsigned char* base = shards_[s]->data;
    if (dtype_ == TokenDtype::kUint16) {
      const auto* p = reinterpret_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
    } else {
      const auto* p = reinterpret_cast<const uint32_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
    }
    out += n;
    start += n;
    count -= n;
    ++s;
  }
}

int64_t TokenSplit::document_of(int64_t position) const {
  return std::upper_bound(doc_starts_.begin(), doc_starts_.end(), position) - doc_starts_.begin() - 1;
}

std::shared_ptr<TokenShards> TokenShards::open(const std::string& dir, const OpenShardsOptions& options) {
  const fs::path meta_path = fs::path(dir) / "meta.json";
  std::ifstream in(meta_path);
  if (!in) {
    throw std::runtime_error(
        fmt::format("token shards '{}': no meta.json (not a shard folder, or kiln-tokenize did not finish)", dir));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto shards = std::shared_ptr<TokenShards>(new TokenShards());
  shards->dir_ = dir;
  shards->meta_ = ShardSetMeta::from_json(ss.str(), meta_path.string());
  const ShardSetMeta& meta = shards->meta_;
  if (options.expected_fingerprint && *options.expected_fingerprint != meta.tokenizer_fingerprint) {
    throw std::runtime_error(
        fmt::format("token shards '{}': built with tokenizer '{}' (fingerprint {}), but the configured tokenizer's "
                    "fingerprint is {}; "
                    "re-tokenize with the same tokenizer",
                    dir, meta.tokenizer, hex64(meta.tokenizer_fingerprint), hex64(*options.expected_fingerprint)));
  }
  const int64_t width = dtype_bytes(meta.dtype);
  for (const SplitInfo& info : meta.splits) {
    auto split = std::make_shared<TokenSplit>();
    split->dtype_ = meta.dtype;
    split->shard_starts_.push_back(0);
    split->doc_starts_.push_back(0);
    int64_t tokens = 0, documents = 0;
    for (const ShardInfo& sh : info.shards) {
      const std::string bin = (fs::path(dir) / sh.file).string(), idx = (fs::path(dir) / sh.index).string();
      auto mapped = std::make_shared<TokenSplit::Mapped>(bin);
      const auto bad = [&](const std::string& file, const std::string& what) {
        return std::runtime_error(fmt::format("token shards '{}': shard '{}': {}", dir, file, what));
      };
      if (static_cast<int64_t>(mapped->size) != sh.tokens * width) {
        throw bad(sh.file,
                  fmt::format("{} bytes, but meta.json says {} tokens of {} ({} bytes): dtype or file disagrees",
                              mapped->size, sh.tokens, dtype_name(meta.dtype), sh.tokens * width));
      }
      TokenSplit::Mapped index(idx);
      if (static_cast<int64_t>(index.size) != (sh.documents + 1) * 8) {
        throw bad(sh.index, fmt::format("{} bytes, but meta.json says {} documents ({} bytes)", index.size,
                                        sh.documents, (sh.documents + 1) * 8));
      }
      if (options.verify_checksums) {
        if (const uint64_t c = xxh64(mapped->data, mapped->size); c != sh.checksum)
          throw bad(sh.file, fmt::format("checksum xxh64:{} differs from meta.json's xxh64:{} (corrupted or rewritten)",
                                         hex64(c), hex64(sh.checksum)));
        if (const uint64_t c = xxh64(index.data, index.size); c != sh.index_checksum)
          throw bad(sh.index,
                    fmt::format("checksum xxh64:{} differs from meta.json's xxh64:{} (corrupted or rewritten)",
                                hex64(c), hex64(sh.index_checksum)));
      }
      const auto* starts = reinterpret_cast<const uint64_t*>(index.data);
      if (starts[0] != 0 || static_cast<int64_t>(starts[sh.documents]) != sh.tokens)
        throw bad(sh.index, "document offsets do not start at 0 and end at the token count");
      for (int64_t d = 1; d <= sh.documents; ++d) {
        if (starts[d] < starts[d - 1]) throw bad(sh.index, fmt::format("document offsets decrease at entry {}", d));
        split->doc_starts_.push_back(tokens + static_cast<int64_t>(starts[d]));
      }
      const int64_t max_id = meta.dtype == TokenDtype::kUint16 ? max_of<uint16_t>(mapped->data, mapped->size)
                                                               : max_of<uint32_t>(mapped->data, mapped->size);
      if (max_id >= meta.vocab_size) {
        throw bad(sh.file, fmt::format("holds token id {}, but meta.json's vocab_size is {} (made with another "
                                       "tokenizer, or meta.json was edited)",
                                       max_id, meta.vocab_size));
      }
      split->max_token_id_ = std::max(split->max_token_id_, max_id);
      tokens += sh.tokens;
      documents += sh.documents;
      split->shards_.push_back(std::move(mapped));
      split->shard_starts_.push_back(tokens);
    }
    if (tokens != info.tokens || documents != info.documents) {
      throw std::runtime_error(fmt::format(
          "token shards '{}': split '{}' totals ({} tokens, {} documents) disagree with its shards ({}, {})", dir,
          info.name, info.tokens, info.documents, tokens, documents));
    }
    split->tokens_ = tokens;
    shards->splits_.emplace_back(info.name, std::move(split));
  }
  return shards;
}

int64_t TokenShards::max_token_id() const {
  int64_t m = -1;
  for (const auto& [name, s] : splits_) m = std::max(m, s->max_token_id());
  return m;
}

void TokenShards::check_ids_below(int64_t vocab_size, const std::string& what) const {
  for (const auto& [name, s] : splits_) {
    if (s->max_token_id() >= vocab_size) {
      throw std::runtime_error(fmt::format(
          "token shards '{}': split '{}' holds token id {}, but {} is {}: the shards were made with another "
          "tokenizer than this model's",
          dir_, name, s->max_token_id(), what, vocab_size));
    }
  }
}

bool TokenShards::has_split(const std::string& name) const {
  return std::any_of(splits_.begin(), splits_.end(), [&](const auto& s) { return s.first == name; });
}

std::shared_ptr<const TokenSplit> TokenShards::split(const std::string& name) const {
  for (const auto& [n, s] : splits_) {
    if (n == name) return s;
  }
  throw std::runtime_error(fmt::format("token shards '{}': no split '{}'", dir_, name));
}

}  // namespace kiln::data
