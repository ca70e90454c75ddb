// safetensors read/write: the checkpoint format of Hugging Face and of kiln (docs/formats.md).
//
// Why our own reader: the format is tiny (u64 header length, JSON header, raw little-endian
// data), and reading it with mmap gives lazy, per-tensor, zero-copy loads without a Rust or
// Python dependency. A file is validated completely when opened (header JSON, dtypes, shapes
// against byte sizes, offsets in range and not overlapping), so a bad file is one clear error
// naming the file and the tensor, never a crash or a silently wrong tensor later.
//
// Writes go to a temporary file in the target directory and are renamed over the target, so a
// reader never sees a half-written file. Sharded checkpoints follow transformers' layout:
// model-00001-of-00003.safetensors ... plus model.safetensors.index.json (weight_map).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln::io {

// Any problem with a safetensors file or index; what() names the file and, where one is at
// fault, the tensor.
// A refusal of a read has io/input_file.h's shape ("<file>: <field>: expected ..., found ...").
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  SafetensorsError(const std::string& file, const std::string& field, const std::string& expected,
                   const std::string& found);
};

// Format dtype names ("F32", "BF16", ...) <-> LibTorch; throws SafetensorsError for a name or
// type that has no counterpart.
at::ScalarType scalar_type_from_safetensors(const std::string& dtype);
std::string safetensors_dtype_name(at::ScalarType type);
std::vector<std::string> safetensors_dtype_names();  // every dtype this reader supports

struct TensorInfo {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, end exclusive
  uint64_t end = 0;
};

// One open safetensors file. The mapping lives as long as the SafetensorsFile or any tensor
// returned by tensor() that still views it.
class SafetensorsFile {
 public:
  // Maps and validates `path`; throws SafetensorsError.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in file order (by data offset)
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws naming file and tensor
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A CPU tensor over the mapped bytes (no copy) when the data is aligned for its dtype, else a
  // copy. Writes to it never reach the file (private mapping, copy-on-write).
  at::Tensor tensor(const std::string& name) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (any device; copied to CPU contiguous as needed) to `path` atomically. Names
// must be unique and non-empty, and "__metadata__" is reserved.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A checkpoint directory: either one `model.safetensors` or shards listed by
// `model.safetensors.index.json`. Shards are opened lazily, on the first tensor read from them.
class SafetensorsCheckpoint {
 public:
  // `dir` holds model.safetensors.index.json or model.safetensors (tried in that order).
  explicit SafetensorsCheckpoint(const std::string& dir);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  const TensorInfo& info(const std::string& name);
  at::Tensor tensor(const std::string& name);
  // __metadata__ of the single file, or the index's "metadata" values rendered as strings.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<std::string> files() const;  // shard paths

 private:
  SafetensorsFile& shard(const std::string& name);
  std::string dir_;
  std::map<std::string, std::string> shard_of_;  // tensor name -> shard file name
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` into `dir` as one model.safetensors when they fit in `max_shard_bytes`, else
// as shards (tensors in the given order, a new shard when the next would overflow; a tensor
// larger than the limit gets a shard of its own) plus model.safetensors.index.json. Files of an
// earlier save that this one does not rewrite (stale shards, an index) are removed afterwards.
void save_safetensors_checkpoint(const std::string& dir, const NamedTensors& tensors,
                                 const std::map<std::string, std::string>& metadata = {},
                                 uint64_t max_shard_bytes = 5000000000);

// Writes `text` to `path` through a temporary file and rename (atomic on POSIX file systems).
void write_file_atomic(const std::string& path, const std::string& text);
// The same for a body written in pieces: `body` calls `put(data, n)` as often as it needs.
void write_stream_atomic(const std::string& path,
                         const std::function<void(const std::function<void(const void*, size_t)>& put)>& body);

}  // namespace kiln::io
