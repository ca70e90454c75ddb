#include "kiln/io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::io {

using nlohmann::json;

std::string input_error_message(const std::string& file, const std::string& field, const std::string& expected,
                                const std::string& found) {
  std::string m = file + ": ";
  if (!field.empty()) m += field + ": ";
  m += "expected " + expected + ", found " + found;
  // One line: a found value quoted from the file may hold line breaks.
  for (char& c : m) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return m;
}

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

InputError::InputError(std::string file, std::string field, std::string expected, std::string found)
    : std::runtime_error(input_error_message(file, field, expected, found)),
      file_(std::move(file)),
      field_(std::move(field)) {}

void refuse(const std::string& file, const std::string& field, const std::string& expected, const std::string& found) {
  throw InputError(file, field, expected, found);
}

std::string field_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string field_path(const std::string& parent, int64_t index) {
  return fmt::format("{}[{}]", parent, index);
}

RegularFile::RegularFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: open() of a FIFO without a writer would wait forever; of a regular file it is
  // ignored. The flag is cleared once the file is known to be regular.
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) refuse(path, "", "a readable file", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    ::close(fd_);
    refuse(path, "", "a readable file", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    refuse(path, "", "a regular file", kind_of(st.st_mode));
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t RegularFile::read_at(uint64_t pos, void* buf, size_t n) const {
  size_t done = 0;
  auto* out = static_cast<char*>(buf);
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(pos + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      refuse(path_, "", "a readable file",
             fmt::format("a read error at byte {}: {}", pos + done, std::strerror(errno)));
    }
    if (r == 0) break;  // end of file
    done += static_cast<size_t>(r);
  }
  return done;
}

std::string read_input_file(const std::string& path, uint64_t max_bytes) {
  const RegularFile f(path);
  if (f.size() > max_bytes) refuse(path, "", fmt::format("at most {} bytes", max_bytes), fmt::format("{}", f.size()));
  std::string text(static_cast<size_t>(f.size()), '\0');
  text.resize(f.read_at(0, text.data(), text.size()));  // a file cut while it was read: what it has
  return text;
}

json parse_json(const std::string& text, const std::string& file, int max_depth) {
  // The callback sees every value's depth as it is parsed; the parser itself keeps no recursion.
  const json::parser_callback_t depth_limit = [&](int depth, json::parse_event_t, json&) {
    if (depth > max_depth) {
      refuse(file, "", fmt::format("JSON nested at most {} levels deep", max_depth),
             fmt::format("a value nested deeper than {} levels", max_depth));
    }
    return true;
  };
  try {
    return json::parse(text, depth_limit);
  } catch (const json::exception& e) {
    refuse(file, "", "valid JSON", e.what());
  }
}

json read_json_file(const std::string& path, uint64_t max_bytes, int max_depth) {
  return parse_json(read_input_file(path, max_bytes), path, max_depth);
}

std::string describe_json(const json& v) {
  constexpr size_t kShown = 60;
  std::string text = v.dump();
  if (text.size() > kShown) text = text.substr(0, kShown) + "...";
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "the boolean " + text;
    case json::value_t::string:
      return "the string " + text;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "the number " + text;
    case json::value_t::array:
      return fmt::format("an array of {}", v.size());
    case json::value_t::object:
      return fmt::format("an object of {} keys", v.size());
    default:
      return text;
  }
}

int64_t json_integer(const json& v, const std::string& file, const std::string& field, int64_t lo, int64_t hi) {
  const std::string want = fmt::format("an integer in [{}, {}]", lo, hi);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo)))
      refuse(file, field, want, describe_json(v));
    return static_cast<int64_t>(u);
  }
  if (!v.is_number_integer()) refuse(file, field, want, describe_json(v));
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) refuse(file, field, want, describe_json(v));
  return i;
}

double json_number(const json& v, const std::string& file, const std::string& field, double lo, double hi) {
  const std::string want = fmt::format("a finite number in [{}, {}]", lo, hi);
  if (!v.is_number()) refuse(file, field, want, describe_json(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) refuse(file, field, want, describe_json(v));
  return d;
}

uint64_t json_unsigned(const json& v, const std::string& file, const std::string& field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  refuse(file, field, "an integer >= 0", describe_json(v));
}

std::string json_string(const json& v, const std::string& file, const std::string& field) {
  if (!v.is_string()) refuse(file, field, "a string", describe_json(v));
  return v.get<std::string>();
}

bool json_bool(const json& v, const std::string& file, const std::string& field) {
  if (!v.is_boolean()) refuse(file, field, "true or false", describe_json(v));
  return v.get<bool>();
}

const json& json_field(const json& object, const std::string& key, const std::string& file, const std::string& parent) {
  if (!object.is_object()) refuse(file, parent, "a JSON object", describe_json(object));
  const auto it = object.find(key);
  if (it == object.end()) refuse(file, field_path(parent, key), "a value", "no such key");
  return *it;
}

}  // namespace kiln::io
