// Reading files that someone else wrote (checkpoints people download and share, configs,
// tokenizers) so that no file can crash, hang, exhaust memory or leak it (docs/formats.md,
// "Hostile files"):
//   - only regular files: opened without blocking (a FIFO or a device in place of a file would
//     block in open() or read forever), then fstat'ed, and refused unless S_ISREG;
//   - sizes checked before any allocation: a whole-file read has a cap, and every length a file
//     declares is held against the bytes it actually has;
//   - JSON parsed with a nesting limit (nlohmann's copy and dump recurse per level);
//   - one shape for every refusal: "<file>: <field>: expected <what>, found <what>".
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace kiln::io {

// A refused input. what() is one line: "<file>: <field>: expected <expected>, found <found>"
// ("<file>: expected ..., found ..." where the whole file is at fault; field "" then).
class InputError : public std::runtime_error {
 public:
  InputError(std::string file, std::string field, std::string expected, std::string found);
  const std::string& file() const { return file_; }
  const std::string& field() const { return field_; }

 private:
  std::string file_, field_;
};

// The message of that shape (for error types of their own, such as SafetensorsError).
std::string input_error_message(const std::string& file, const std::string& field, const std::string& expected,
                                const std::string& found);

[[noreturn]] void refuse(const std::string& file, const std::string& field, const std::string& expected,
                         const std::string& found);

// A field path: "state[3].exp_avg", "param_groups[0].params", "log_history[12].loss".
std::string field_path(const std::string& parent, const std::string& key);
std::string field_path(const std::string& parent, int64_t index);

// One open regular file. The size is fstat's at open time; reads past it return what the file has.
class RegularFile {
 public:
  // Throws InputError: cannot open (the errno text), or not a regular file (a FIFO, a device, a
  // directory, a socket: found names which).
  explicit RegularFile(const std::string& path);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  // Up to n bytes at pos (pread, retried on EINTR and short reads); fewer only at the end of file.
  size_t read_at(uint64_t pos, void* buf, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Caps on whole-file reads (a file above its cap is refused before anything is allocated).
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{256} << 20;  // trainer_state.json of a long run: tens of MB
inline constexpr int kMaxJsonDepth = 64;                            // HF's and kiln's JSON files nest 5 deep at most

// The whole of a regular file of at most max_bytes (refused above it).
std::string read_input_file(const std::string& path, uint64_t max_bytes);

// JSON text parsed with at most max_depth levels of nesting; throws InputError naming `file`.
nlohmann::json parse_json(const std::string& text, const std::string& file, int max_depth = kMaxJsonDepth);
// read_input_file + parse_json.
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes = kMaxJsonFileBytes,
                              int max_depth = kMaxJsonDepth);

// Numbers of a JSON value, checked: an integer in [lo, hi] (no fraction, no float that happens to
// be whole, no overflow), a finite number in [lo, hi]. Throw InputError with `file` and `field`.
int64_t json_integer(const nlohmann::json& v, const std::string& file, const std::string& field, int64_t lo,
                     int64_t hi);
double json_number(const nlohmann::json& v, const std::string& file, const std::string& field, double lo, double hi);

uint64_t json_unsigned(const nlohmann::json& v, const std::string& file, const std::string& field);
std::string json_string(const nlohmann::json& v, const std::string& file, const std::string& field);
bool json_bool(const nlohmann::json& v, const std::string& file, const std::string& field);
// object[key], refusing a non-object (field `parent`) or a missing key (field parent.key).
const nlohmann::json& json_field(const nlohmann::json& object, const std::string& key, const std::string& file,
                                 const std::string& parent = "");

// What a JSON value is, for "found ...": "the string \"x\"", "the number 4.5", "an array of 3", ...
std::string describe_json(const nlohmann::json& v);

}  // namespace kiln::io
