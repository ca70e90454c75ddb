// tokenize_to_shards: see tokenize.h for the ordering and split rules.
#include "kiln/data/tokenize.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>
#include <nlohmann/json.hpp>

#include "kiln/data/parquet_reader.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

bool is_gz(const fs::path& p) {
  return p.extension() == ".gz" && p.stem().extension() == ".jsonl";
}
bool is_zst(const fs::path& p) {
  return p.extension() == ".zst" && p.stem().extension() == ".jsonl";
}
bool is_parquet(const fs::path& p) {
  return p.extension() == ".parquet";
}

bool is_input_extension(const fs::path& p) {
  return p.extension() == ".txt" || p.extension() == ".jsonl" || p.extension() == ".json" || is_gz(p) || is_zst(p) ||
         is_parquet(p);
}

// A gzip file as a stream (zlib's gzread; a plain file is read as is, as gzread does).
class GzStreambuf : public std::streambuf {
 public:
  explicit GzStreambuf(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")), buffer_(1 << 16) {}
  ~GzStreambuf() override {
    if (file_) gzclose(file_);
  }
  bool ok() const { return file_ != nullptr; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const int n = gzread(file_, buffer_.data(), static_cast<unsigned>(buffer_.size()));
    if (n < 0) {
      int code = 0;
      const char* what = gzerror(file_, &code);
      throw std::runtime_error(fmt::format("'{}': cannot decompress ({})", path_, what ? what : "gzip error"));
    }
    if (n == 0) {
      int code = Z_OK;
      gzerror(file_, &code);
      // zlib returns what it could decompress and then flags a stream cut short with Z_BUF_ERROR.
      if (code == Z_BUF_ERROR) throw std::runtime_error(fmt::format("'{}': truncated gzip data", path_));
      return traits_type::eof();
    }
    setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  std::string path_;
  gzFile file_;
  std::vector<char> buffer_;
};

// A zstd file as a stream: libzstd's streaming decompression (ZSTD_decompressStream), which
// also reads files of several concatenated frames, as the zstd tool writes and reads them.
class ZstdStreambuf : public std::streambuf {
 public:
  explicit ZstdStreambuf(const std::string& path)
      : path_(path), in_buffer_(ZSTD_DStreamInSize()), buffer_(ZSTD_DStreamOutSize()) {
    file_.open(path, std::ios::in | std::ios::binary);
    if (file_.is_open()) dctx_ = ZSTD_createDCtx();
  }
  ~ZstdStreambuf() override { ZSTD_freeDCtx(dctx_); }
  bool ok() const { return dctx_ != nullptr; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    while (true) {
      if (input_.pos == input_.size && !eof_) {
        file_.read(in_buffer_.data(), static_cast<std::streamsize>(in_buffer_.size()));
        input_ = {in_buffer_.data(), static_cast<size_t>(file_.gcount()), 0};
        eof_ = input_.size == 0;
      }
      // 0 from the last call: a frame ended and all its output was returned. At the end of the
      // file that is the end; otherwise the call is made again with no input, to flush what the
      // last one could not return, and a call that returns nothing then means a truncated frame.
      if (eof_ && last_hint_ == 0) return traits_type::eof();
      ZSTD_outBuffer out{buffer_.data(), buffer_.size(), 0};
      last_hint_ = ZSTD_decompressStream(dctx_, &out, &input_);
      if (ZSTD_isError(last_hint_))
        throw std::runtime_error(fmt::format("'{}': cannot decompress ({})", path_, ZSTD_getErrorName(last_hint_)));
      if (out.pos > 0) {
        setg(buffer_.data(), buffer_.data(), buffer_.data() + out.pos);
        return traits_type::to_int_type(*gptr());
      }
      if (eof_) throw std::runtime_error(fmt::format("'{}': truncated zstd data", path_));
    }
  }

 private:
  std::string path_;
  std::ifstream file_;
  ZSTD_DCtx* dctx_ = nullptr;
  std::vector<char> in_buffer_, buffer_;
  ZSTD_inBuffer input_{nullptr, 0, 0};
  size_t last_hint_ = 1;  // not at a frame end: an empty file is no zstd data
  bool eof_ = false;
};

// Bytes of text a file holds, for the progress bar: its size; for gzip the size its trailer
// records (mod 2^32); for zstd the content size its first frame records, if any (one frame is
// what zstd and most writers make), else the compressed size; for Parquet the text column's
// uncompressed size in the metadata.
int64_t text_bytes(const std::string& path, const std::string& key) {
  const auto size = static_cast<int64_t>(fs::file_size(path));
  if (is_parquet(path)) return ParquetTextReader(path, key).column_bytes();
  if (is_zst(path)) {
    std::ifstream in(path, std::ios::binary);
    char header[18] = {};  // ZSTD_FRAMEHEADERSIZE_MAX, a macro of libzstd's static-only API
    in.read(header, sizeof header);
    const auto n = ZSTD_getFrameContentSize(header, static_cast<size_t>(in.gcount()));
    return n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR ? size : static_cast<int64_t>(n);
  }
  if (!is_gz(path) || size < 18) return size;
  std::ifstream in(path, std::ios::binary);
  in.seekg(size - 4);
  unsigned char b[4] = {};
  in.read(reinterpret_cast<char*>(b), 4);
  return static_cast<int64_t>(b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint32_t>(b[3]) << 24);
}

// One input file, with the JSON field and the document group (dataset) it belongs to.
struct InputFile {
  std::string path, text_key;
  int group = 0;
};

// Reads documents file by file in order; next_chunk() returns about `chunk_bytes` of them.
class DocumentReader {
 public:
  DocumentReader(std::vector<InputFile> files, const TokenizeOptions& options)
      : files_(std::move(files)), options_(options) {}

  bool next_chunk(size_t chunk_bytes, std::vector<std::string>& docs) {
    docs.clear();
    size_t bytes = 0;
    while (bytes < chunk_bytes) {
      if (!buf_ && !parquet_ && array_.empty()) {
        if (next_file_ >= files_.size()) break;
        const InputFile& f = files_[next_file_++];
        path_ = f.path;
        key_ = f.text_key;
        group_ = f.group;
        if (group_full()) {  // max documents of this group reached: skip its other files
          bytes_done += text_bytes(path_, key_);
          continue;
        }
        open();
        const auto ext = fs::path(path_).extension();
        jsonl_ = ext == ".jsonl" || ext == ".json" || is_gz(path_) || is_zst(path_);
        line_ = 0;
        if (ext == ".json" && starts_with_bracket()) read_array();
      }
      if (parquet_ && array_.empty()) {  // the next batch of rows of a Parquet file
        std::vector<std::string> batch;
        if (parquet_->next(batch)) {
          for (auto& d : batch) array_.push_back(std::move(d));
        } else {
          close();
        }
        continue;
      }
      if (!array_.empty()) {  // the documents of a .json array or a Parquet batch, one at a time
        std::string doc = std::move(array_.front());
        array_.pop_front();
        bytes += doc.size();
        if (parquet_) {
          bytes_done += static_cast<int64_t>(doc.size());
        } else if (array_.empty()) {
          bytes_done += array_bytes_;
        }
        add(docs, std::move(doc));
        if (group_full()) {
          if (!parquet_ && !array_.empty()) bytes_done += array_bytes_;
          array_.clear();
          close();
        }
        continue;
      }
      if (!jsonl_ && options_.txt_unit == TxtUnit::kFile) {
        std::stringstream ss;
        ss << in_.rdbuf();
        std::string doc = std::move(ss).str();  // the file's one copy
        bytes += doc.size();
        bytes_done += static_cast<int64_t>(doc.size());
        add(docs, std::move(doc));
        close();
        continue;
      }
      if (group_full() || !std::getline(in_, text_)) {
        close();
        continue;
      }
      ++line_;
      bytes += text_.size() + 1;
      bytes_done += static_cast<int64_t>(text_.size()) + 1;
      if (!jsonl_) {
        if (!text_.empty()) add(docs, std::move(text_));
        continue;
      }
      if (text_.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::string error;
      try {
        auto j = nlohmann::json::parse(text_);
        error = take_text(j, docs);
      } catch (const nlohmann::json::exception& e) {
        error = fmt::format("invalid JSON ({})", e.what());
      }
      if (!error.empty()) bad(fmt::format("{}:{}: {}", path_, line_, error));
    }
    return !docs.empty();
  }

  int64_t bytes_done = 0, bad_lines = 0, nulls = 0;
  // Documents handed out per group (dataset), groups 0..max.
  std::vector<int64_t> group_documents() const {
    int max_group = -1;
    for (const auto& f : files_) max_group = std::max(max_group, f.group);
    std::vector<int64_t> out(static_cast<size_t>(max_group + 1), 0);
    for (const auto& [group, count] : group_docs_) out[static_cast<size_t>(group)] = count;
    return out;
  }

 private:
  bool group_full() const {
    const int64_t max = options_.max_documents_per_group;
    const auto it = group_docs_.find(group_);
    return max > 0 && it != group_docs_.end() && it->second >= max;
  }
  void add(std::vector<std::string>& docs, std::string doc) {
    docs.push_back(std::move(doc));
    ++group_docs_[group_];
  }
  void bad(const std::string& message) {
    if (!options_.skip_bad_lines) throw std::runtime_error(message + " (pass --skip-bad-lines to skip such lines)");
    ++bad_lines;
    if (options_.on_warning) options_.on_warning(message);
  }
  // The document of one JSON record; an error text when it has none.
  std::string take_text(nlohmann::json& j, std::vector<std::string>& docs) {
    if (!j.is_object()) return "not a JSON object";
    const auto it = j.find(key_);
    if (it == j.end()) return fmt::format("no key '{}'", key_);
    if (it->is_null()) {  // as a Parquet null: an empty document (parquet_reader.h says why)
      ++nulls;
      add(docs, "");
      return "";
    }
    if (!it->is_string()) return fmt::format("'{}' is not a string", key_);
    add(docs, std::move(it->get_ref<std::string&>()));
    return "";
  }
  // A .json file is a JSON array of objects when its first non-blank character is '[', else
  // JSON Lines (the two layouts HF's json loader reads).
  bool starts_with_bracket() {
    char c = 0;
    while (in_.get(c) && std::isspace(static_cast<unsigned char>(c))) {
    }
    const bool bracket = in_ && c == '[';
    in_.clear();
    in_.seekg(0);
    return bracket;
  }
  // Reads a whole .json array; its documents are handed out by next_chunk.
  void read_array() {
    array_bytes_ = static_cast<int64_t>(fs::file_size(path_));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in_);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(fmt::format("{}: invalid JSON ({})", path_, e.what()));
    }
    close();
    std::vector<std::string> docs;
    for (size_t i = 0; i < j.size(); ++i) {
      const int64_t before = group_docs_[group_];
      const std::string error = take_text(j[i], docs);
      group_docs_[group_] = before;  // counted when handed out
      if (!error.empty()) bad(fmt::format("{}: element {}: {}", path_, i, error));
    }
    if (docs.empty()) bytes_done += array_bytes_;
    for (auto& d : docs) array_.push_back(std::move(d));
  }

  std::vector<InputFile> files_;
  const TokenizeOptions& options_;
  size_t next_file_ = 0;
  void open() {
    if (is_parquet(path_)) {
      parquet_ = std::make_unique<ParquetTextReader>(path_, key_);
      return;
    }
    if (is_zst(path_)) {
      auto zst = std::make_unique<ZstdStreambuf>(path_);
      if (!zst->ok()) throw std::runtime_error(fmt::format("'{}': cannot open", path_));
      buf_ = std::move(zst);
    } else if (is_gz(path_)) {
      auto gz = std::make_unique<GzStreambuf>(path_);
      if (!gz->ok()) throw std::runtime_error(fmt::format("'{}': cannot open", path_));
      buf_ = std::move(gz);
    } else {
      auto file = std::make_unique<std::filebuf>();
      if (!file->open(path_, std::ios::in | std::ios::binary))
        throw std::runtime_error(fmt::format("'{}': cannot open", path_));
      buf_ = std::move(file);
    }
    in_.rdbuf(buf_.get());
    in_.clear();
    // A decompression error thrown by the stream buffer reaches the caller (an istream would
    // otherwise swallow it into badbit, and a damaged file would read as a shorter one).
    in_.exceptions(std::ios::badbit);
  }
  void close() {
    in_.exceptions(std::ios::goodbit);
    in_.rdbuf(nullptr);
    buf_.reset();
    if (parquet_) nulls += parquet_->nulls();
    parquet_.reset();
  }

  std::unique_ptr<std::streambuf> buf_;  // std::filebuf, GzStreambuf (.jsonl.gz), ZstdStreambuf (.jsonl.zst)
  std::unique_ptr<ParquetTextReader> parquet_;
  std::istream in_{nullptr};
  std::string path_, text_, key_;
  int group_ = 0;
  std::map<int, int64_t> group_docs_;
  std::deque<std::string> array_;
  int64_t array_bytes_ = 0;
  bool jsonl_ = false;
  int64_t line_ = 0;
};

// Each input's files with their JSON field and group.
std::vector<InputFile> input_files(const TokenizeOptions& options) {
  const auto& in = options.inputs;
  if (!options.input_text_keys.empty() && options.input_text_keys.size() != in.size())
    throw std::invalid_argument("input_text_keys must have one entry per input");
  if (!options.input_groups.empty() && options.input_groups.size() != in.size())
    throw std::invalid_argument("input_groups must have one entry per input");
  std::vector<InputFile> out;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string& key = options.input_text_keys.empty() ? options.text_key : options.input_text_keys[i];
    const int group = options.input_groups.empty() ? static_cast<int>(i) : options.input_groups[i];
    for (auto& f : list_input_files({in[i]})) out.push_back({std::move(f), key, group});
  }
  return out;
}

// Removes what a previous (possibly crashed) run left: meta.json first, so that the folder is
// never a valid-looking shard set while it is being rewritten.
void clear_output(const fs::path& dir, bool overwrite) {
  if (fs::exists(dir / "meta.json")) {
    if (!overwrite)
      throw std::runtime_error(
          fmt::format("'{}' already holds a shard set (meta.json); pass --overwrite to replace it", dir.string()));
    fs::remove(dir / "meta.json");
  }
  if (!fs::exists(dir)) return;
  static const std::regex ours(R"((train|val)_\d{5}\.(bin|idx)(\.tmp)?|meta\.json\.tmp)");
  for (const auto& e : fs::directory_iterator(dir)) {
    if (std::regex_match(e.path().filename().string(), ours)) fs::remove(e.path());
  }
}

}  // namespace

bool is_input_file(const std::string& path) {
  return is_input_extension(fs::path(path));
}

std::vector<std::string> list_input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    const fs::path p(input);
    if (fs::is_directory(p)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(p)) {
        if (e.is_regular_file() && is_input_extension(e.path())) found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      if (found.empty())
        throw std::runtime_error(fmt::format(
            "input '{}': folder holds no .txt, .jsonl, .jsonl.gz, .jsonl.zst, .json or .parquet files", input));
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p)) {
      if (!is_input_extension(p))
        throw std::runtime_error(
            fmt::format("input '{}': not a .txt, .jsonl, .jsonl.gz, .jsonl.zst, .json or .parquet file", input));
      files.push_back(input);
    } else {
      throw std::runtime_error(fmt::format("input '{}': no such file or folder", input));
    }
  }
  return files;
}

std::vector<std::string> read_documents(const TokenizeOptions& options) {
  DocumentReader reader(input_files(options), options);
  std::vector<std::string> all, chunk;
  while (reader.next_chunk(size_t{64} << 20, chunk)) std::move(chunk.begin(), chunk.end(), std::back_inserter(all));
  return all;
}

namespace {
TokenizeReport tokenize_into(const Tokenizer& tokenizer, const TokenizeOptions& options,
                             const std::vector<InputFile>& files, int64_t bytes_total);
}  // namespace

TokenizeReport tokenize_to_shards(const Tokenizer& tokenizer, const TokenizeOptions& options) {
  if (options.val_fraction < 0 || options.val_fraction >= 1)
    throw std::invalid_argument(fmt::format("val fraction {} is outside [0, 1)", options.val_fraction));
  if (options.output_dir.empty()) throw std::invalid_argument("no output folder");
  const auto files = input_files(options);
  int64_t bytes_total = 0;
  for (const auto& f : files) bytes_total += text_bytes(f.path, f.text_key);
  const fs::path out_dir(options.output_dir);
  clear_output(out_dir, options.overwrite);
  const bool created = !fs::exists(out_dir);
  fs::create_directories(out_dir);
  // A failed run leaves nothing: its shard files go, and so does the folder if it made it.
  try {
    return tokenize_into(tokenizer, options, files, bytes_total);
  } catch (...) {
    std::error_code ec;
    clear_output(out_dir, /*overwrite=*/true);
    if (created && fs::is_empty(out_dir, ec)) fs::remove(out_dir, ec);
    throw;
  }
}

namespace {

TokenizeReport tokenize_into(const Tokenizer& tokenizer, const TokenizeOptions& options,
                             const std::vector<InputFile>& files, int64_t bytes_total) {
  const int threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  ShardSetMeta meta;
  meta.tokenizer = tokenizer.name();
  meta.tokenizer_fingerprint = tokenizer.fingerprint();
  meta.vocab_size = tokenizer.vocab_size();
  meta.bos_id = tokenizer.bos_id();
  meta.eos_id = tokenizer.eos_id();
  meta.add_special_tokens = options.add_special_tokens;
  meta.dtype = dtype_for_vocab(meta.vocab_size);
  ShardWriter train(options.output_dir, "train", meta.dtype, options.shard_tokens);
  std::unique_ptr<ShardWriter> val;
  if (options.val_fraction > 0)
    val = std::make_unique<ShardWriter>(options.output_dir, "val", meta.dtype, options.shard_tokens);

  DocumentReader reader(files, options);
  TokenizeReport report;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> docs;
  std::vector<std::vector<int32_t>> ids;
  const int32_t eos = options.separator_id >= 0 ? options.separator_id : tokenizer.eos_id();
  const size_t chunk_bytes = size_t{4} << 20 << (threads > 1 ? 2 : 0);
  while (reader.next_chunk(chunk_bytes, docs)) {
    ids.assign(docs.size(), {});
    const auto work = [&](size_t begin, size_t end) {
      for (size_t d = begin; d < end; ++d) {
        tokenizer.encode_into(docs[d], ids[d], options.add_special_tokens);
        ids[d].push_back(eos);
      }
    };
    const size_t n = docs.size(), t = std::min<size_t>(threads, n);
    if (t <= 1) {
      work(0, n);
    } else {
      std::vector<std::thread> pool;
      std::vector<std::exception_ptr> errors(t);
      for (size_t k = 0; k < t; ++k) {
        pool.emplace_back([&, k] {
          try {
            work(n * k / t, n * (k + 1) / t);
          } catch (...) {
            errors[k] = std::current_exception();
          }
        });
      }
      for (auto& th : pool) th.join();
      for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
      }
    }
    for (size_t d = 0; d < n; ++d) {
      const int64_t i = report.documents++;
      const double f = options.val_fraction;
      const bool to_val = val && static_cast<int64_t>((i + 1) * f) > static_cast<int64_t>(i * f);
      (to_val ? *val : train).add_document(ids[d]);
      report.tokens += static_cast<int64_t>(ids[d].size());
    }
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options.on_progress)
      options.on_progress({reader.bytes_done, bytes_total, report.documents, report.tokens, report.seconds});
  }
  meta.splits.push_back(train.finish());
  if (val) meta.splits.push_back(val->finish());
  if (meta.splits[0].documents == 0) throw std::runtime_error("the inputs hold no documents");
  write_shard_meta(options.output_dir, meta);
  report.meta = meta;
  report.bytes = reader.bytes_done;
  report.bad_lines = reader.bad_lines;
  report.nulls = reader.nulls;
  report.group_documents = reader.group_documents();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace

std::string decode_continuation(const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                std::span<const int32_t> generated) {
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), generated.begin(), generated.end());
  const std::string full = tokenizer.decode(all, /*skip_special_tokens=*/true);
  const std::string head = tokenizer.decode(prompt, /*skip_special_tokens=*/true);
  if (full.compare(0, head.size(), head) == 0) return full.substr(head.size());
  return tokenizer.decode(generated, /*skip_special_tokens=*/true);
}

EncodedPrompt encode_prompt(const Tokenizer& tokenizer, std::string_view text, BosRule rule,
                            const std::optional<DataRecord>& record) {
  EncodedPrompt out;
  switch (rule) {
    case BosRule::kAdd:
      if (tokenizer.bos_id() < 0)
        throw std::invalid_argument(fmt::format("--add-bos: tokenizer '{}' has no BOS token", tokenizer.name()));
      out.ids.push_back(tokenizer.bos_id());
      tokenizer.encode_into(text, out.ids, false);
      out.rule = "BOS added (--add-bos)";
      break;
    case BosRule::kNone:
      tokenizer.encode_into(text, out.ids, false);
      out.rule = "no BOS (--no-add-bos)";
      break;
    case BosRule::kAuto:
      if (record) {
        tokenizer.encode_into(text, out.ids, record->add_special_tokens);
        out.rule = record->add_special_tokens ? "the tokenizer's template, as in the training shards (kiln_data.json)"
                                              : "no BOS, as in the training shards (kiln_data.json)";
      } else if (tokenizer.name() == "byte") {
        tokenizer.encode_into(text, out.ids, false);
        out.rule = "no BOS (byte tokenizer)";
      } else {
        tokenizer.encode_into(text, out.ids, true);
        out.rule = "the tokenizer's template, as HF's tokenizer(text)";
      }
      break;
  }
  return out;
}

BlockBos block_bos(BosRule rule, const std::optional<DataRecord>& record, const Tokenizer* tokenizer,
                   const ShardSetMeta& shards) {
  switch (rule) {
    case BosRule::kAdd:
      if (shards.bos_id < 0)
        throw std::invalid_argument(
            fmt::format("--add-bos: the shards' tokenizer '{}' has no BOS token", shards.tokenizer));
      return {shards.bos_id, "BOS added (--add-bos)"};
    case BosRule::kNone:
      return {-1, "no BOS (--no-add-bos)"};
    case BosRule::kAuto:
      break;
  }
  if (record) return {-1, "the blocks as the model was trained on them (kiln_data.json)"};
  if (shards.add_special_tokens) return {-1, "the blocks as they are: the shards' documents start with the template"};
  if (!tokenizer || tokenizer->name() == "byte") return {-1, "no BOS (no tokenizer template)"};
  const std::vector<int32_t> empty = tokenizer->encode("", true);
  if (!empty.empty() && empty.front() == tokenizer->bos_id() && tokenizer->bos_id() >= 0) {
    return {tokenizer->bos_id(), "the tokenizer's template BOS, as HF's tokenizer(text)"};
  }
  return {-1, "no BOS (the tokenizer's template adds none)"};
}

}  // namespace kiln::data
