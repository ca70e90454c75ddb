// TensorBoard event files (report_to: tensorboard), written without TensorFlow or protobuf.
//
// An event file is a TFRecord stream: each record is
//   uint64 length (LE) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data
// and each record's data is one serialized tensorboard `Event` protobuf. kiln writes only the few
// fields TensorBoard's scalar dashboard reads: wall_time (1, double), step (2, int64),
// file_version (3, string "brain.Event:2", the first event of a file) and summary (5) holding
// Summary.value (1) entries {tag (1, string), simple_value (2, float)}. Encoding those by hand is
// a few dozen lines; kiln has no protobuf dependency and Debian 12 packages no CRC32C library
// (docs/training.md, "TensorBoard"). tests/python/test_run_outputs.py reads the files with the
// tensorboard package's EventAccumulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

// One Event protobuf with scalar summaries (empty `scalars`: only wall_time and step), or the
// file_version event when `file_version` is not empty.
std::string encode_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars,
                         std::string_view file_version = {});
// `data` framed as one TFRecord record.
std::string tfrecord(std::string_view data);

// Appends events to <dir>/events.out.tfevents.<seconds>.<hostname>.<pid>.0 (the name
// TensorBoard's own writer uses, so the reader finds it). Created on construction with the
// file_version event; every write is flushed to the file, so a crash loses nothing written.
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One event at `step` holding every (tag, value) pair (wall_time = now).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace kiln::train
