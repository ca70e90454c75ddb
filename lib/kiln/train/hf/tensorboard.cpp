// TensorBoard event files: see tensorboard.h for the record and protobuf layout.
#include "kiln/train/hf/tensorboard.h"

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include <unistd.h>

#include <fmt/format.h>

namespace kiln::train {

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protobuf wire format: varints, and tags (field << 3 | wire type).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as x86 and ARM store it
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto& table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string encode_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars,
                         std::string_view file_version) {
  std::string event;
  put_tag(event, 1, 1);  // wall_time: double
  put_fixed(event, wall_time);
  if (step != 0) {
    put_tag(event, 2, 0);  // step: int64 varint
    put_varint(event, static_cast<uint64_t>(step));
  }
  if (!file_version.empty()) put_bytes(event, 3, file_version);
  if (!scalars.empty()) {
    std::string summary;
    for (const auto& [tag, value] : scalars) {
      std::string v;
      put_bytes(v, 1, tag);  // Summary.Value.tag
      put_tag(v, 2, 5);      // Summary.Value.simple_value: float
      put_fixed(v, value);
      put_bytes(summary, 1, v);  // Summary.value
    }
    put_bytes(event, 5, summary);  // Event.summary
  }
  return event;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  const uint64_t length = data.size();
  put_fixed(out, length);
  put_fixed(out, masked_crc32c(out.data(), 8));
  out.append(data);
  put_fixed(out, masked_crc32c(data.data(), data.size()));
  return out;
}

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(fmt::format("logging_dir '{}': cannot create: {}", dir, ec.message()));
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{}.{}.{}.0", static_cast<int64_t>(std::time(nullptr)), host, ::getpid()))
              .string();
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) throw std::runtime_error(fmt::format("{}: cannot create: {}", path_, std::strerror(errno)));
  write(encode_event(now_seconds(), 0, {}, "brain.Event:2"));
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  write(encode_event(now_seconds(), step, scalars));
}

void EventWriter::write(const std::string& event) {
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    throw std::runtime_error(fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
  }
}

}  // namespace kiln::train
