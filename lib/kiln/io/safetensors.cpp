// safetensors reader (mmap, validated up front, lazy zero-copy tensors) and atomic writer.
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the data section; each
// header entry gives dtype, shape and [begin, end) byte offsets into the data section.
#include "kiln/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/io/input_file.h"

namespace kiln::io {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The header is JSON of a few entries per tensor; anything near this is corrupt (the Rust
// implementation uses the same limit).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeEntry kDtypes[] = {
    {"BOOL", at::kBool},
    {"U8", at::kByte},
    {"I8", at::kChar},
    {"I16", at::kShort},
    {"U16", at::kUInt16},
    {"I32", at::kInt},
    {"U32", at::kUInt32},
    {"I64", at::kLong},
    {"U64", at::kUInt64},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"F32", at::kFloat},
    {"F64", at::kDouble},
    {"C64", at::kComplexFloat},
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E4M3FNUZ", at::kFloat8_e4m3fnuz},
    {"F8_E5M2", at::kFloat8_e5m2},
    {"F8_E5M2FNUZ", at::kFloat8_e5m2fnuz},
    {"F8_E8M0", at::kFloat8_e8m0fnu},
};

// One shape for every refusal (io/input_file.h): "<file>: <field>: expected ..., found ...".
[[noreturn]] void fail(const std::string& file, const std::string& field, const std::string& expected,
                       const std::string& found) {
  throw SafetensorsError(file, field, expected, found);
}

// io/input_file.h's refusals (the same message shape) as this reader's error type.
template <typename Fn>
auto as_safetensors_error(Fn&& fn) {
  try {
    return fn();
  } catch (const InputError& e) {
    throw SafetensorsError(e.what());
  }
}

std::string tensor_field(const std::string& tensor, const std::string& key = "") {
  return fmt::format("tensor '{}'{}", tensor, key.empty() ? "" : "." + key);
}

[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor, const std::string& key,
                              const std::string& expected, const std::string& found) {
  fail(file, tensor_field(tensor, key), expected, found);
}

std::string errno_text() {
  return std::strerror(errno);
}

// A non-negative JSON integer as u64, or nullopt.
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const json& entry, uint64_t data_size) {
  if (!entry.is_object()) fail_tensor(file, name, "", "a header entry object", describe_json(entry));
  TensorInfo info;
  info.name = name;
  auto field = [&](const char* key) -> const json& {
    const auto it = entry.find(key);
    if (it == entry.end()) fail_tensor(file, name, key, fmt::format("'{}' in its header entry", key), "no such key");
    return *it;
  };
  const json& dtype = field("dtype");
  if (!dtype.is_string()) fail_tensor(file, name, "dtype", "a dtype name", describe_json(dtype));
  try {
    info.dtype = scalar_type_from_safetensors(dtype.get<std::string>());
  } catch (const SafetensorsError&) {
    fail_tensor(file, name, "dtype", fmt::format("one of {}", fmt::join(safetensors_dtype_names(), ", ")),
                fmt::format("'{}'", dtype.get<std::string>().substr(0, 40)));
  }
  const json& shape = field("shape");
  if (!shape.is_array() || shape.size() > 64)
    fail_tensor(file, name, "shape", "an array of at most 64 sizes", describe_json(shape));
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : shape) {
    const auto n = as_u64(d);
    if (!n || *n > static_cast<uint64_t>(INT64_MAX)) {
      fail_tensor(file, name, "shape", "non-negative integer sizes", shape.dump().substr(0, 80));
    }
    info.shape.push_back(static_cast<int64_t>(*n));
    if (*n != 0 && numel > UINT64_MAX / *n) overflow = true;
    numel *= *n;
  }
  const json& offsets = field("data_offsets");
  std::optional<uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) begin = as_u64(offsets[0]), end = as_u64(offsets[1]);
  if (!begin || !end) {
    fail_tensor(file, name, "data_offsets", "[begin, end] byte offsets", offsets.dump().substr(0, 80));
  }
  info.begin = *begin;
  info.end = *end;
  if (info.begin > info.end) {
    fail_tensor(file, name, "data_offsets", "an end at or after the begin",
                fmt::format("[{}, {}] (they end before they begin)", info.begin, info.end));
  }
  if (info.end > data_size) {
    fail_tensor(file, name, "data_offsets", fmt::format("offsets within the data section's {} bytes", data_size),
                fmt::format("[{}, {}], past the end of the data section (file truncated?)", info.begin, info.end));
  }
  const uint64_t element = c10::elementSize(info.dtype);
  if (overflow || (numel != 0 && numel > UINT64_MAX / element) || numel * element != info.end - info.begin) {
    fail_tensor(file, name, "data_offsets",
                fmt::format("the {} bytes shape {} of {} needs",
                            overflow ? std::string("too many") : std::to_string(numel * element),
                            shape_text(info.shape), dtype.get<std::string>()),
                fmt::format("[{}, {}], which hold {} bytes", info.begin, info.end, info.end - info.begin));
  }
  return info;
}

}  // namespace

SafetensorsError::SafetensorsError(const std::string& file, const std::string& field, const std::string& expected,
                                   const std::string& found)
    : std::runtime_error(input_error_message(file, field, expected, found)) {}

at::ScalarType scalar_type_from_safetensors(const std::string& dtype) {
  for (const auto& d : kDtypes) {
    if (dtype == d.name) return d.type;
  }
  std::string known;
  for (const auto& d : kDtypes) known += (known.empty() ? "" : ", ") + std::string(d.name);
  throw SafetensorsError(fmt::format("unknown dtype '{}' (supported: {})", dtype, known));
}

std::string safetensors_dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return d.name;
  }
  throw SafetensorsError(fmt::format("dtype {} has no safetensors equivalent", c10::toString(type)));
}

std::vector<std::string> safetensors_dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.emplace_back(d.name);
  return names;
}

// ---------------------------------------------------------------------------------------------
// Reading

struct SafetensorsFile::Mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) munmap(addr, size);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), mapping_(std::make_shared<Mapping>()) {
  // Opened without blocking, regular files only (io/input_file.h): a FIFO would hang open().
  const auto file = as_safetensors_error([&] { return std::make_unique<RegularFile>(path); });
  const int fd = file->fd();
  const uint64_t size = file->size();
  if (size < 8)
    fail(path, "", "at least the 8-byte header length", fmt::format("{} bytes (too short; truncated?)", size));
  // Private and writable: tensors handed out may be modified in place (copy-on-write), and
  // nothing ever reaches the file.
  mapping_->addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (mapping_->addr == MAP_FAILED) fail(path, "", "a file that can be mapped", std::strerror(errno));
  mapping_->size = size;
  const auto* bytes = static_cast<const uint8_t*>(mapping_->addr);

  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > size - 8) {
    fail(path, "header length", fmt::format("at most the {} bytes after it", size - 8),
         fmt::format("header length {}, past the end of the file (truncated or not safetensors?)", header_len));
  }
  if (header_len > kMaxHeaderBytes)
    fail(path, "header length", "at most 100 MiB", fmt::format("header length {}", header_len));
  const json header = as_safetensors_error([&] {
    return parse_json(std::string(reinterpret_cast<const char*>(bytes + 8), static_cast<size_t>(header_len)), path);
  });
  if (!header.is_object()) fail(path, "header", "a JSON object", describe_json(header));
  data_ = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__", "an object of strings", describe_json(entry));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, fmt::format("__metadata__['{}']", key), "a string", describe_json(value));
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_entry(path, name, entry, data_size));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const TensorInfo &prev = tensors_[i - 1], &cur = tensors_[i];
    if (cur.begin < prev.end) {
      fail_tensor(path, cur.name, "data_offsets", "bytes of its own",
                  fmt::format("[{}, {}], which overlap those of tensor '{}' [{}, {}]", cur.begin, cur.end, prev.name,
                              prev.begin, prev.end));
    }
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail_tensor(path_, name, "", "a tensor of the file", "no such tensor");
  return tensors_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& t = info(name);
  const auto options = at::TensorOptions().dtype(t.dtype).device(at::kCPU);
  if (t.end == t.begin) return at::empty(t.shape, options);
  uint8_t* ptr = const_cast<uint8_t*>(data_ + t.begin);
  if (reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(t.dtype) == 0) {
    std::shared_ptr<Mapping> keep = mapping_;
    return at::from_blob(
        ptr, t.shape, [keep](void*) {}, options);
  }
  // Misaligned for the dtype (offsets need not be aligned): a copy is the only safe view.
  at::Tensor out = at::empty(t.shape, options);
  std::memcpy(out.data_ptr(), ptr, t.end - t.begin);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

std::string temp_path_for(const std::string& path) {
  std::random_device rd;
  return fmt::format("{}.tmp.{}.{:08x}", path, ::getpid(), rd());
}

// Writes through a temporary file (fsynced) and renames it over `path`.
template <typename WriteFn>
void write_atomic(const std::string& path, WriteFn&& write_body) {
  const std::string tmp = temp_path_for(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw SafetensorsError(fmt::format("cannot create '{}': {}", tmp, errno_text()));
  auto put = [&](const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw SafetensorsError(fmt::format("cannot write '{}': {}", path, errno_text()));
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  try {
    write_body(put);
    if (::fsync(fd) != 0) throw SafetensorsError(fmt::format("cannot sync '{}': {}", path, errno_text()));
    if (::close(fd) != 0) throw SafetensorsError(fmt::format("cannot close '{}': {}", path, errno_text()));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw SafetensorsError(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, why));
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& text) {
  write_atomic(path, [&](auto&& put) { put(text.data(), text.size()); });
}

void write_stream_atomic(const std::string& path,
                         const std::function<void(const std::function<void(const void*, size_t)>& put)>& body) {
  write_atomic(path, [&](auto&& put) { body(put); });
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  std::vector<std::pair<std::string, at::Tensor>> cpu;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") {
      fail(path, "tensor name", "a name other than '' and '__metadata__'", fmt::format("'{}'", name));
    }
    if (!seen.insert(name).second) fail_tensor(path, name, "", "each name once", "the name given twice");
    if (!tensor.defined()) fail_tensor(path, name, "", "a defined tensor", "an undefined one");
    try {
      safetensors_dtype_name(tensor.scalar_type());
    } catch (const SafetensorsError&) {
      fail_tensor(path, name, "dtype", "a dtype safetensors has", c10::toString(tensor.scalar_type()));
    }
    cpu.emplace_back(name, tensor.detach().to(at::kCPU).contiguous());
  }
  // Larger elements first: every offset is then a multiple of its own element size (given an
  // 8-byte aligned data section), so a reader can view the data in place.
  std::stable_sort(cpu.begin(), cpu.end(),
                   [](const auto& a, const auto& b) { return a.second.element_size() > b.second.element_size(); });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : cpu) {
    const uint64_t n = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data section is 8-byte aligned
  const uint64_t header_len = text.size();
  write_atomic(path, [&](auto&& put) {
    put(&header_len, 8);
    put(text.data(), text.size());
    for (const auto& [name, t] : cpu) put(t.data_ptr(), t.nbytes());
  });
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path index_path = fs::path(dir) / kIndexFile;
  const fs::path single_path = fs::path(dir) / kSingleFile;
  if (fs::exists(index_path)) {
    const std::string ipath = index_path.string();
    const json index = as_safetensors_error([&] { return read_json_file(ipath); });
    if (!index.is_object()) fail(ipath, "", "a JSON object", describe_json(index));
    const auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object())
      fail(ipath, "weight_map", "an object of tensor names and files",
           map == index.end() ? "no such key" : describe_json(*map));
    for (const auto& [name, file] : map->items()) {
      const std::string field = fmt::format("weight_map['{}']", name);
      if (!file.is_string()) fail(ipath, field, "a file name in the checkpoint directory", describe_json(file));
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        fail(ipath, field, "a file name in the checkpoint directory", fmt::format("'{}'", f.substr(0, 80)));
      }
      shard_of_[name] = f;
    }
    if (const auto meta = index.find("metadata"); meta != index.end() && meta->is_object()) {
      for (const auto& [key, value] : meta->items()) {
        metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
      }
    }
  } else if (fs::exists(single_path)) {
    auto file = std::make_unique<SafetensorsFile>(single_path.string());
    for (const auto& name : file->names()) shard_of_[name] = kSingleFile;
    metadata_ = file->metadata();
    open_[kSingleFile] = std::move(file);
  } else {
    fail(dir, "", fmt::format("a checkpoint folder with {} or {}", kSingleFile, kIndexFile), "neither");
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : shard_of_) out.push_back(name);
  return out;
}

std::vector<std::string> SafetensorsCheckpoint::files() const {
  std::set<std::string> unique;
  for (const auto& [name, file] : shard_of_) unique.insert((fs::path(dir_) / file).string());
  return {unique.begin(), unique.end()};
}

SafetensorsFile& SafetensorsCheckpoint::shard(const std::string& name) {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    fail(dir_, tensor_field(name), "a tensor of the checkpoint", "no such tensor");
  }
  auto& file = open_[it->second];
  if (!file) file = std::make_unique<SafetensorsFile>((fs::path(dir_) / it->second).string());
  if (!file->contains(name)) {
    fail_tensor(file->path(), name, "", fmt::format("the tensor {} lists in this shard", kIndexFile), "no such tensor");
  }
  return *file;
}

const TensorInfo& SafetensorsCheckpoint::info(const std::string& name) {
  return shard(name).info(name);
}

at::Tensor SafetensorsCheckpoint::tensor(const std::string& name) {
  return shard(name).tensor(name);
}

void save_safetensors_checkpoint(const std::string& dir, const NamedTensors& tensors,
                                 const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SafetensorsError(fmt::format("cannot create checkpoint directory '{}': {}", dir, ec.message()));
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.defined() ? t.nbytes() : 0;

  std::set<std::string> written;
  if (total <= max_shard_bytes) {
    save_safetensors((fs::path(dir) / kSingleFile).string(), tensors, metadata);
    written.insert(kSingleFile);
  } else {
    std::vector<NamedTensors> shards(1);
    uint64_t current = 0;
    for (const auto& item : tensors) {
      const uint64_t n = item.second.defined() ? item.second.nbytes() : 0;
      if (!shards.back().empty() && current + n > max_shard_bytes) {
        shards.emplace_back();
        current = 0;
      }
      shards.back().push_back(item);
      current += n;
    }
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      save_safetensors((fs::path(dir) / file).string(), shards[i], metadata);
      for (const auto& [name, t] : shards[i]) weight_map[name] = file;
      written.insert(file);
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
    written.insert(kIndexFile);
  }
  // Remove what an earlier save left that this layout does not use, so the directory holds
  // exactly one consistent checkpoint.
  static const std::regex shard_name(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == kSingleFile || name == kIndexFile || std::regex_match(name, shard_name);
    if (ours && !written.count(name)) fs::remove(entry.path(), ec);
  }
}

}  // namespace kiln::io
