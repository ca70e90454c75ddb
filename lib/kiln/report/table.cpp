// See table.h.
#include "kiln/report/table.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "kiln/io/safetensors.h"

namespace kiln::report {

namespace fs = std::filesystem;

double in_unit(double v, char prefix) {
  return prefix == 'G'   ? v / 1e9
         : prefix == 'M' ? v / 1e6
         : prefix == 'm' ? v * 1e3
         : prefix == 'u' ? v * 1e6
         : prefix == '%' ? v * 100
                         : v;
}

std::string cell(const std::optional<double>& v, char prefix, const char* format) {
  return v ? fmt::format(fmt::runtime(format), in_unit(*v, prefix)) : "n/a";
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  }
  return out;
}
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}
std::string markdown_line(const std::vector<std::string>& cells) {
  std::string l = "|";
  for (const auto& c : cells) l += " " + c + " |";
  return l + "\n";
}

std::vector<std::string> write_files(const std::string& dir, const std::string& stem,
                                     const std::vector<std::string>& formats,
                                     const std::function<std::string(const std::string&)>& render,
                                     const std::vector<std::string>& allowed) {
  for (const auto& f : formats) {
    if (std::find(allowed.begin(), allowed.end(), f) == allowed.end()) {
      std::string list;
      for (size_t i = 0; i < allowed.size(); ++i)
        list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
      throw std::invalid_argument(fmt::format("--format: '{}' is not {}", f, list));
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot create the output directory: {}", dir, ec.message()));
  std::vector<std::string> written;
  for (const auto& f : formats) {
    const fs::path path = fs::path(dir) / (stem + "." + f);
    io::write_file_atomic(path.string(), render(f));
    written.push_back(path.string());
  }
  return written;
}

std::string html_page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html_escape(title) +
         R"(</title>
<style>
body { font-family: sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 12px 0; }
th, td { border: 1px solid #bbb; padding: 3px 7px; text-align: right; }
th { background: #eee; }
td.l { text-align: left; }
td.oom { color: #b00; font-weight: bold; }
tr.best { background: #dfd; }
tr.no { color: #999; }
tr.miss td.r { background: #fdd; }
.bar { background: #69c; height: 10px; display: inline-block; }
svg.chart { display: block; margin: 16px 0; background: #fff; border: 1px solid #ccc; }
svg.chart text { font-family: sans-serif; }
svg .title { font-weight: bold; font-size: 14px; }
svg .tick, svg .legend { font-size: 11px; }
svg .oom { fill: #b00; font-weight: bold; font-size: 12px; }
.note { color: #555; font-size: 13px; }
.warning { color: #b00; font-weight: bold; }
</style></head><body>
)" + body +
         "</body></html>\n";
}

}  // namespace kiln::report
