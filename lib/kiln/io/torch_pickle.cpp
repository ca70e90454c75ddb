#include "kiln/io/torch_pickle.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_set>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <caffe2/serialize/versions.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/storage_context.h>

#include "kiln/io/input_file.h"
#include "kiln/io/pickle_scan.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {

namespace {

// CPU, contiguous copies of every tensor in `v` (the pickler writes a tensor's whole storage: a
// view of a larger buffer would carry the rest of it along).
c10::IValue to_cpu(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().detach().to(at::kCPU).contiguous().clone();
  if (v.isGenericDict()) {
    const auto in = v.toGenericDict();
    c10::Dict<c10::IValue, c10::IValue> out(in.keyType(), in.valueType());
    for (const auto& e : in) out.insert(e.key(), to_cpu(e.value()));
    return out;
  }
  if (v.isList()) {
    const auto in = v.toList();
    c10::List<c10::IValue> out(c10::AnyType::get());  // typed lists pickle through torch.jit helpers
    for (const c10::IValue& e : in) out.push_back(to_cpu(e));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& e : v.toTupleRef().elements()) items.push_back(to_cpu(e));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return v;
}

}  // namespace

void save_torch_pickle(const std::string& path, const c10::IValue& value) {
  const c10::IValue cpu = to_cpu(value);
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(cpu);
  pickler.stop();
  write_stream_atomic(path, [&](const std::function<void(const void*, size_t)>& put) {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
      put(data, n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  });
}

namespace {

// ---- the zip archive, checked before LibTorch's reader opens it

uint16_t le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(le16(p)) | (static_cast<uint32_t>(le16(p + 2)) << 16);
}
uint64_t le64(const uint8_t* p) {
  return static_cast<uint64_t>(le32(p)) | (static_cast<uint64_t>(le32(p + 4)) << 32);
}

// PyTorchStreamReader's constructor reads the "version" record, and every getRecord allocates
// the size the central directory declares before it extracts anything: a deflated record (a zip
// bomb) or a declared size beyond the file would be allocated and filled from the file's word.
// LibTorch exposes no way to see a record's method or sizes before that, so the central directory
// is walked here (the bounds only; the records are read by LibTorch): every record stored
// uncompressed (torch.save never compresses), its declared size within the file, and the records
// together no larger than the file (overlapping records would multiply it).
void check_zip_directory(const RegularFile& f) {
  const std::string& path = f.path();
  const uint64_t size = f.size();
  constexpr uint64_t kEocd = 22, kMaxComment = 65535;
  if (size < kEocd) refuse(path, "", "a torch.save file (a zip archive)", fmt::format("{} bytes", size));
  const uint64_t tail_len = std::min(size, kEocd + kMaxComment);
  std::vector<uint8_t> tail(tail_len);
  f.read_at(size - tail_len, tail.data(), tail_len);
  int64_t at = -1;
  for (int64_t i = static_cast<int64_t>(tail_len - kEocd); i >= 0; --i) {
    if (le32(&tail[static_cast<size_t>(i)]) == 0x06054b50u) {
      at = i;
      break;
    }
  }
  if (at < 0) refuse(path, "", "a torch.save file (a zip archive)", "no zip end-of-central-directory record");
  const uint8_t* e = &tail[static_cast<size_t>(at)];
  uint64_t entries = le16(e + 10), dir_size = le32(e + 12), dir_offset = le32(e + 16);
  const uint64_t eocd_pos = size - tail_len + static_cast<uint64_t>(at);
  // zip64 (torch.save always writes it), taken exactly when miniz takes it: a locator just before
  // the end record whose zip64 end record carries its signature; then its counts and offsets win.
  uint8_t loc[20], z[56];
  if (eocd_pos >= 20 && f.read_at(eocd_pos - 20, loc, 20) == 20 && le32(loc) == 0x07064b50u) {
    const uint64_t z_at = le64(loc + 8);
    if (size < 56 || z_at > size - 56)
      refuse(path, "zip directory", "a zip64 end record within the file", fmt::format("offset {}", z_at));
    if (f.read_at(z_at, z, 56) == 56 && le32(z) == 0x06064b50u) {
      entries = le64(z + 32);
      dir_size = le64(z + 40);
      dir_offset = le64(z + 48);
    }
  }
  constexpr uint64_t kMaxEntries = 1 << 20, kMaxDirBytes = uint64_t{256} << 20;
  if (entries > kMaxEntries || dir_size > kMaxDirBytes || dir_offset > size || dir_size > size - dir_offset) {
    refuse(path, "zip directory", "a central directory within the file",
           fmt::format("{} entries, {} bytes at offset {} of a {}-byte file", entries, dir_size, dir_offset, size));
  }
  std::vector<uint8_t> dir(static_cast<size_t>(dir_size));
  if (f.read_at(dir_offset, dir.data(), dir.size()) != dir.size())
    refuse(path, "zip directory", "a central directory within the file", "a short read");
  struct Record {
    std::string name;
    uint64_t local, size;
  };
  std::vector<Record> list;
  uint64_t total = 0;
  size_t p = 0;
  for (uint64_t n = 0; n < entries; ++n) {
    if (p + 46 > dir.size() || le32(&dir[p]) != 0x02014b50u)
      refuse(path, "zip directory", fmt::format("{} central directory entries", entries), fmt::format("{}", n));
    const uint8_t* c = &dir[p];
    const uint16_t method = le16(c + 10), name_len = le16(c + 28), extra_len = le16(c + 30), comment_len = le16(c + 32);
    uint64_t comp = le32(c + 20), uncomp = le32(c + 24), local = le32(c + 42);
    if (p + 46 + name_len + extra_len + comment_len > dir.size())
      refuse(path, "zip directory", "entries within the central directory", "an entry running past it");
    const std::string name(reinterpret_cast<const char*>(c + 46), name_len);
    // zip64 sizes and offset, in this order, where the 32-bit field is all ones.
    for (size_t x = 0; x + 4 <= extra_len;) {
      const uint8_t* h = c + 46 + name_len + x;
      const uint16_t id = le16(h), len = le16(h + 2);
      if (x + 4 + len > extra_len) break;
      if (id == 0x0001) {
        size_t q = 4;
        for (uint64_t* v : {&uncomp, &comp, &local}) {
          if (*v == 0xffffffffu && q + 8 <= 4u + len) {
            *v = le64(h + q);
            q += 8;
          }
        }
      }
      x += 4 + len;
    }
    const std::string field = fmt::format("zip record {}", name.substr(0, 100));
    if (method != 0)
      refuse(path, field, "a stored record (torch.save does not compress)", fmt::format("method {}", method));
    // miniz extracts nothing for what it takes for a directory (a DOS directory attribute, a name
    // ending in '/'), and getRecord would hand out its buffer unwritten; nor does it read an
    // encrypted record. torch.save sets only the data-descriptor and UTF-8 flags.
    const uint16_t flags = le16(c + 8);
    const uint32_t external = le32(c + 38);
    if ((external & 0x10u) != 0 || name.empty() || name.back() == '/')
      refuse(path, field, "a file record", "a directory entry");
    if ((flags & ~0x0808u) != 0)
      refuse(path, field, "the flags torch.save writes (data descriptor, UTF-8)", fmt::format("0x{:04x}", flags));
    if (comp != uncomp) refuse(path, field, "equal stored and declared sizes", fmt::format("{} and {}", comp, uncomp));
    if (local > size || uncomp > size - local)
      refuse(path, field, fmt::format("a record within the file's {} bytes", size),
             fmt::format("{} bytes at offset {}", uncomp, local));
    total += uncomp;
    if (total > size)
      refuse(path, "zip directory", fmt::format("records within the file's {} bytes together", size),
             fmt::format("at least {} (records that overlap)", total));
    p += 46 + name_len + extra_len + comment_len;
    list.push_back({name, local, uncomp});
  }
  // What PyTorchStreamReader's constructor reads after miniz has set up its state: an exception
  // there never frees that state (the destructor does not run), so it must not throw. The first
  // record's folder names the archive; every record's local header and data lie within the file;
  // the version record is a number LibTorch supports.
  if (list.empty()) refuse(path, "zip directory", "the records of a torch.save file", "none");
  const size_t slash = list.front().name.find('/');
  if (slash == std::string::npos || slash == 0)
    refuse(path, "zip directory", "records in a folder (archive/...)",
           fmt::format("'{}'", list.front().name.substr(0, 100)));
  // miniz finds a record by its name without regard to case (LibTorch passes no flags), so two
  // names that differ only in case would make which one LibTorch reads a matter of its index.
  const auto lower = [](std::string t) {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t;
  };
  const std::string folder = lower(list.front().name.substr(0, slash + 1));
  std::set<std::string> names;
  const Record* version = nullptr;
  uint64_t version_at = 0;  // where its data starts
  for (const Record& r : list) {
    const std::string name = lower(r.name);
    if (!names.insert(name).second)
      refuse(path, "zip directory", "each record name once", fmt::format("'{}' twice", r.name.substr(0, 100)));
    uint8_t h[30];
    const std::string field = fmt::format("zip record {}", r.name.substr(0, 100));
    if (r.local > size - std::min<uint64_t>(size, 30) || f.read_at(r.local, h, 30) != 30 || le32(h) != 0x04034b50u)
      refuse(path, field, "a local file header at its offset", fmt::format("none at {}", r.local));
    const uint64_t data = r.local + 30 + le16(h + 26) + le16(h + 28);
    if (le16(h + 8) != 0 || data > size || r.size > size - data)
      refuse(path, field, "stored data within the file", fmt::format("{} bytes at offset {}", r.size, data));
    if (name == folder + ".data/version" || (name == folder + "version" && version == nullptr)) {
      version = &r;
      version_at = data;
    }
  }
  if (version == nullptr) refuse(path, "version", "a version record", "none");
  char text[24] = {};
  const size_t got =
      f.read_at(version_at, text, static_cast<size_t>(std::min<uint64_t>(version->size, sizeof(text) - 1)));
  const std::string v(text, got);
  const size_t digits = v.find_first_not_of(" \t\n\r");
  const size_t end = v.find_first_not_of("0123456789", digits == std::string::npos ? v.size() : digits);
  const std::string number = digits == std::string::npos ? "" : v.substr(digits, end - digits);
  if (number.empty() || number.size() > 9 || std::stoull(number) < caffe2::serialize::kMinSupportedFileFormatVersion ||
      std::stoull(number) > caffe2::serialize::kMaxSupportedFileFormatVersion) {
    refuse(path, "version",
           fmt::format("a file format version in [{}, {}]", caffe2::serialize::kMinSupportedFileFormatVersion,
                       caffe2::serialize::kMaxSupportedFileFormatVersion),
           fmt::format("'{}'", v.substr(0, 20)));
  }
}

// LibTorch's reader over a RegularFile (no blocking open, size from fstat).
class CheckedFileAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit CheckedFileAdapter(std::shared_ptr<const RegularFile> f) : f_(std::move(f)) {}
  size_t size() const override { return static_cast<size_t>(f_->size()); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    return pos >= f_->size() ? 0 : f_->read_at(pos, buf, static_cast<size_t>(std::min<uint64_t>(n, f_->size() - pos)));
  }

 private:
  std::shared_ptr<const RegularFile> f_;
};

// The path of an element below `parent`: "state[3].exp_avg", "param_groups[0]".
std::string child_path(const std::string& parent, const c10::IValue& key) {
  if (key.isString()) return field_path(parent, key.toStringRef());
  if (key.isInt()) return field_path(parent, key.toInt());
  return parent + "[?]";
}

// Every tensor LibTorch built is a dense CPU view inside its storage (the storages are the
// archive's records, whole: see load_torch_pickle). Walked once per container (values may be shared).
void check_tensors(const c10::IValue& root, const std::string& path) {
  std::vector<std::pair<c10::IValue, std::string>> todo{{root, ""}};
  std::unordered_set<const void*> seen;
  while (!todo.empty()) {
    auto [v, at] = std::move(todo.back());
    todo.pop_back();
    const std::string where = at.empty() ? "(the top level)" : at;
    if (v.isPtrType() && !seen.insert(v.internalToPointer()).second) continue;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.layout() != at::kStrided || !t.is_cpu())
        refuse(path, where, "a dense CPU tensor", fmt::format("{} on {}", c10::str(t.layout()), t.device().str()));
      const int64_t offset = t.storage_offset();
      if (offset < 0) refuse(path, where, "a storage offset >= 0", fmt::format("{}", offset));
      unsigned __int128 last = static_cast<uint64_t>(offset);
      bool empty = false;
      for (int64_t d = 0; d < t.dim(); ++d) {
        const int64_t n = t.size(d), s = t.stride(d);
        if (n < 0 || s < 0)
          refuse(path, where, "sizes and strides >= 0",
                 fmt::format("sizes {} strides {}", c10::str(t.sizes()), c10::str(t.strides())));
        if (n == 0) empty = true;
        if (n > 0) last += static_cast<unsigned __int128>(n - 1) * static_cast<uint64_t>(s);
      }
      const uint64_t bytes = t.storage().nbytes(), item = t.element_size();
      if (!empty && (last + 1) * item > bytes) {
        refuse(path, where, fmt::format("a view within its storage of {} bytes", bytes),
               fmt::format("sizes {} strides {} at offset {} of {}-byte elements", c10::str(t.sizes()),
                           c10::str(t.strides()), offset, item));
      }
    } else if (v.isGenericDict()) {
      for (const auto& e : v.toGenericDict()) todo.emplace_back(e.value(), child_path(at, e.key()));
    } else if (v.isList()) {
      const auto list = v.toList();
      for (size_t i = 0; i < list.size(); ++i) todo.emplace_back(list.get(i), field_path(at, static_cast<int64_t>(i)));
    } else if (v.isTuple()) {
      const auto& items = v.toTupleRef().elements();
      for (size_t i = 0; i < items.size(); ++i) todo.emplace_back(items[i], field_path(at, static_cast<int64_t>(i)));
    }
  }
}

constexpr uint64_t kMaxPickleBytes = uint64_t{64} << 20;  // a state dict's pickle: KBs to a few MB

}  // namespace

c10::IValue load_torch_pickle(const std::string& path) {
  auto file = std::make_shared<const RegularFile>(path);
  check_zip_directory(*file);
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<CheckedFileAdapter>(file));
    if (!reader.hasRecord("data.pkl")) refuse(path, "data.pkl", "the pickle of a torch.save file", "no such record");
    const size_t pickle_size = reader.getRecordSize("data.pkl");
    if (pickle_size > kMaxPickleBytes)
      refuse(path, "data.pkl", fmt::format("at most {} bytes", kMaxPickleBytes), fmt::format("{}", pickle_size));
    const auto [pickle, pickle_bytes] = reader.getRecord("data.pkl");
    const auto record_bytes = [&](const std::string& key) -> std::optional<uint64_t> {
      const std::string name = "data/" + key;
      if (!reader.hasRecord(name)) return std::nullopt;
      return reader.getRecordSize(name);
    };
    const PickleScan scan =
        scan_torch_pickle(static_cast<const uint8_t*>(pickle.get()), pickle_bytes, record_bytes, path);
    // Each storage is its record, whole: LibTorch's unpickler would size it by the pickle's element
    // count instead (a record shorter than that is read past its end).
    auto storages = std::make_shared<torch::jit::DeserializationStorageContext>();
    for (const std::string& key : scan.storage_keys) {
      auto [data, bytes] = reader.getRecord("data/" + key);
      storages->addStorage(key, c10::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(data),
                                             /*allocator=*/nullptr, /*resizable=*/false));
    }
    c10::IValue value = torch::jit::readArchiveAndTensors(
        "data", /*pickle_prefix=*/"", /*tensor_prefix=*/"", /*type_resolver=*/std::nullopt,
        /*obj_loader=*/std::nullopt, at::Device(at::kCPU), reader, torch::jit::Unpickler::defaultTypeParser, storages);
    check_tensors(value, path);
    return value;
  } catch (const InputError&) {
    throw;
  } catch (const c10::Error& e) {
    refuse(path, "", "a torch.save file LibTorch can read", e.what_without_backtrace());
  } catch (const std::exception& e) {
    refuse(path, "", "a torch.save file LibTorch can read", e.what());
  }
}

namespace torch_pickle {

c10::IValue list(const std::vector<c10::IValue>& items) {
  c10::List<c10::IValue> out(c10::AnyType::get());
  for (const auto& v : items) out.push_back(v);
  return out;
}

c10::IValue dict(const std::vector<std::pair<std::string, c10::IValue>>& items) {
  c10::Dict<c10::IValue, c10::IValue> out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [k, v] : items) out.insert(k, v);
  return out;
}

}  // namespace torch_pickle

}  // namespace kiln::io
