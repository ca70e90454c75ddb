// The text column of a Parquet file, read a batch of rows at a time through Apache Arrow C++
// (parquet_reader.cpp is the only source that includes Arrow; third_party/kiln_arrow.cmake finds
// it). Built without Arrow, every function but parquet_supported()/parquet_build_info() throws a
// message saying how to enable it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::data {

// Whether this build reads .parquet files, and which Arrow it uses (or why there is none).
bool parquet_supported();
std::string parquet_build_info();

// Streams one string (or large_string) column of a Parquet file in row order. Memory is bounded
// by one batch of decoded strings plus Arrow's read buffer, whatever the file and row-group
// sizes (the column's pages are read through a buffered stream, row group after row group).
// A batch is `batch_rows` rows; 0 picks about 8 MiB of text per batch from the metadata's
// average row size (1 to 65,536 rows), so that long documents (books) make smaller batches.
// A null value is an empty document: LLaMA-Factory's alpaca converter turns a missing or null
// prompt into "" (so its pretraining example is the EOS alone) and HF's loaders keep the row.
class ParquetTextReader {
 public:
  // Throws (naming the file) when it cannot be read, the column is missing (the message lists the
  // file's columns) or is not a string column.
  ParquetTextReader(const std::string& path, const std::string& column, int64_t batch_rows = 0);
  ~ParquetTextReader();
  ParquetTextReader(const ParquetTextReader&) = delete;
  ParquetTextReader& operator=(const ParquetTextReader&) = delete;

  // Appends the next batch's values to `out`; false (nothing appended) at the end of the file.
  bool next(std::vector<std::string>& out);

  int64_t rows() const;          // rows in the file (its metadata)
  int64_t row_groups() const;    // row groups in the file
  int64_t column_bytes() const;  // the column's uncompressed size in the metadata (progress total)
  int64_t nulls() const;         // null values read so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::data
