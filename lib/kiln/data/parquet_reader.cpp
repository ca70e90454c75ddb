// ParquetTextReader: see parquet_reader.h. The only source that includes Arrow, so that its
// headers cost one compile; without KILN_WITH_PARQUET it compiles to the refusing stubs.
#include "kiln/data/parquet_reader.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#ifdef KILN_WITH_PARQUET
#include <arrow/array.h>
#include <arrow/io/file.h>
#include <arrow/record_batch.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#include <parquet/schema.h>
#endif

#ifndef KILN_PARQUET_INFO
#define KILN_PARQUET_INFO "unknown"
#endif

namespace kiln::data {

bool parquet_supported() {
#ifdef KILN_WITH_PARQUET
  return true;
#else
  return false;
#endif
}

std::string parquet_build_info() {
  return KILN_PARQUET_INFO;
}

#ifdef KILN_WITH_PARQUET

struct ParquetTextReader::Impl {
  std::string path, column;
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::unique_ptr<arrow::RecordBatchReader> batches;
  int64_t rows = 0, row_groups = 0, column_bytes = 0, nulls = 0;
};

namespace {

constexpr int64_t kAutoBatchBytes = int64_t{8} << 20;

// Uncompressed bytes of all row groups (every column: an upper bound of the text column's).
int64_t total_byte_size(const parquet::FileMetaData& md) {
  int64_t total = 0;
  for (int g = 0; g < md.num_row_groups(); ++g) total += md.RowGroup(g)->total_byte_size();
  return total;
}

template <typename ArrayType>
void append_strings(const arrow::Array& column, std::vector<std::string>& out, int64_t& nulls) {
  const auto& a = static_cast<const ArrayType&>(column);
  for (int64_t i = 0; i < a.length(); ++i) {
    if (a.IsNull(i)) {
      ++nulls;
      out.emplace_back();
    } else {
      out.emplace_back(a.GetView(i));
    }
  }
}

// Arrow's messages span lines (the thrift error, then what failed); kiln's errors are one line.
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at)) text.replace(at, 1, "; ");
  return text;
}

}  // namespace

ParquetTextReader::ParquetTextReader(const std::string& path, const std::string& column, int64_t batch_rows)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.path = path;
  m.column = column;
  auto fail = [&](const std::string& what) { throw std::runtime_error(fmt::format("'{}': {}", path, what)); };
  auto file = arrow::io::ReadableFile::Open(path);
  if (!file.ok()) fail(fmt::format("cannot open ({})", one_line(file.status().message())));
  try {
    // A buffered stream reads the column's pages a piece at a time rather than a whole column
    // chunk (row group) at once; no pre-buffering, no threads: memory stays one batch's worth.
    parquet::ReaderProperties props;
    props.enable_buffered_stream();
    props.set_buffer_size(int64_t{1} << 20);
    parquet::arrow::FileReaderBuilder builder;
    const auto opened = builder.Open(*file, props);
    if (!opened.ok()) fail(fmt::format("not a readable Parquet file ({})", one_line(opened.message())));
    if (batch_rows <= 0) {  // about kAutoBatchBytes of text per batch, by the metadata's sizes
      const auto md = builder.raw_reader()->metadata();
      const int64_t bytes = md->num_rows() > 0 ? std::max<int64_t>(1, total_byte_size(*md) / md->num_rows()) : 1;
      batch_rows = std::clamp<int64_t>(kAutoBatchBytes / bytes, 1, 65536);
    }
    parquet::ArrowReaderProperties arrow_props;
    arrow_props.set_batch_size(batch_rows);
    arrow_props.set_pre_buffer(false);
    arrow_props.set_use_threads(false);
    builder.properties(arrow_props);
    auto built = builder.Build();
    if (!built.ok()) fail(fmt::format("not a readable Parquet file ({})", one_line(built.status().message())));
    m.reader = std::move(*built);

    std::shared_ptr<arrow::Schema> schema;
    const auto got = m.reader->GetSchema(&schema);
    if (!got.ok()) fail(fmt::format("cannot read the schema ({})", one_line(got.message())));
    const auto field = schema->GetFieldByName(column);
    if (!field) {
      std::string names;
      for (const auto& f : schema->fields()) names += (names.empty() ? "" : ", ") + f->name();
      fail(fmt::format("no column '{}' (its columns: {})", column, names));
    }
    const auto type = field->type()->id();
    if (type != arrow::Type::STRING && type != arrow::Type::LARGE_STRING)
      fail(fmt::format("column '{}' is {}, not a string column", column, field->type()->ToString()));
    const auto metadata = m.reader->parquet_reader()->metadata();
    const int leaf = metadata->schema()->ColumnIndex(column);
    if (leaf < 0) fail(fmt::format("column '{}' is not a top-level column", column));
    m.rows = metadata->num_rows();
    m.row_groups = metadata->num_row_groups();
    for (int g = 0; g < metadata->num_row_groups(); ++g)
      m.column_bytes += metadata->RowGroup(g)->ColumnChunk(leaf)->total_uncompressed_size();
    std::vector<int> groups(static_cast<size_t>(m.row_groups));
    std::iota(groups.begin(), groups.end(), 0);
    auto batches = m.reader->GetRecordBatchReader(groups, {leaf});
    if (!batches.ok()) fail(fmt::format("cannot read column '{}' ({})", column, one_line(batches.status().message())));
    m.batches = std::move(*batches);
  } catch (const parquet::ParquetException& e) {
    fail(fmt::format("not a readable Parquet file ({})", e.what()));
  }
}

ParquetTextReader::~ParquetTextReader() = default;

bool ParquetTextReader::next(std::vector<std::string>& out) {
  auto& m = *impl_;
  std::shared_ptr<arrow::RecordBatch> batch;
  try {
    const auto read = m.batches->ReadNext(&batch);
    if (!read.ok())
      throw std::runtime_error(
          fmt::format("'{}': cannot read column '{}' ({})", m.path, m.column, one_line(read.message())));
  } catch (const parquet::ParquetException& e) {
    throw std::runtime_error(fmt::format("'{}': cannot read column '{}' ({})", m.path, m.column, e.what()));
  }
  if (!batch) return false;
  const arrow::Array& column = *batch->column(0);
  if (column.type_id() == arrow::Type::LARGE_STRING) {
    append_strings<arrow::LargeStringArray>(column, out, m.nulls);
  } else {
    append_strings<arrow::StringArray>(column, out, m.nulls);
  }
  return true;
}

int64_t ParquetTextReader::rows() const {
  return impl_->rows;
}
int64_t ParquetTextReader::row_groups() const {
  return impl_->row_groups;
}
int64_t ParquetTextReader::column_bytes() const {
  return impl_->column_bytes;
}
int64_t ParquetTextReader::nulls() const {
  return impl_->nulls;
}

#else  // !KILN_WITH_PARQUET

struct ParquetTextReader::Impl {};

ParquetTextReader::ParquetTextReader(const std::string& path, const std::string&, int64_t) {
  throw std::runtime_error(fmt::format(
      "'{}': this kiln was built without Parquet support ({}); to read .parquet files, install pyarrow into "
      "the build's Python environment (scripts/setup.sh does) or a system Apache Arrow C++ with Parquet, "
      "then configure again (-DKILN_PARQUET=ON makes it required)",
      path, KILN_PARQUET_INFO));
}
ParquetTextReader::~ParquetTextReader() = default;
bool ParquetTextReader::next(std::vector<std::string>&) {
  return false;
}
int64_t ParquetTextReader::rows() const {
  return 0;
}
int64_t ParquetTextReader::row_groups() const {
  return 0;
}
int64_t ParquetTextReader::column_bytes() const {
  return 0;
}
int64_t ParquetTextReader::nulls() const {
  return 0;
}

#endif

}  // namespace kiln::data
