// The generic report module (report/table.h): one column list rendered to Markdown, CSV, HTML and
// JSON, each checked against the text written out by hand here; the report files written
// atomically, a format outside the allowed list refused naming it before anything is written; the
// one HTML page.
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <catch2/catch.hpp>

#include "kiln/report/table.h"

namespace {

namespace fs = std::filesystem;
using kiln::report::Column;
using kiln::report::json;

struct Row {
  std::string name;
  double bytes;
  std::optional<double> seconds;
};

std::vector<Column<Row>> columns() {
  using R = const Row&;
  return {{"name", [](R r) { return r.name; }, "name", [](R r) { return json(r.name); }},
          kiln::report::number<Row>("MB", "bytes", 'M', "{:.2f}", &Row::bytes),
          kiln::report::field<Row>("seconds", &Row::seconds),
          {"bar", [](R r) { return "<b>" + r.name + "</b>"; }, "", {}, false, "", false, true}};
}

const std::vector<Row> kRows = {{"a, b", 1.5e6, 0.25}, {"<c>", 2e6, std::nullopt}};

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("one column list renders to Markdown, CSV, HTML and JSON", "[report]") {
  using namespace kiln::report;
  // The HTML-only column is in no text format; the JSON-only field in no table.
  CHECK(markdown_table(columns(), kRows, true) == "| name | MB |\n| --- | ---: |\n| a, b | 1.50 |\n| <c> | 2.00 |\n");
  CHECK(csv_table(columns(), kRows) == "name,MB\n\"a, b\",1.50\n<c>,2.00\n");
  CHECK(html_table<Row>("<table>", columns(), kRows) ==
        "<table><thead><tr><th>name</th><th>MB</th><th>bar</th></tr></thead><tbody>\n"
        "<tr><td>a, b</td><td>1.50</td><td><b>a, b</b></td></tr>\n"
        "<tr><td>&lt;c&gt;</td><td>2.00</td><td><b><c></b></td></tr>\n</tbody></table>");
  CHECK(json_rows(columns(), kRows) == json::parse(R"([{"name": "a, b", "bytes": 1.5e6, "seconds": 0.25},
                                                       {"name": "<c>", "bytes": 2e6, "seconds": null}])"));
  CHECK(object("a", 1, "b", std::optional<double>()) == json::parse(R"({"a": 1, "b": null})"));
}

TEST_CASE("report files: each format written whole, a refused format names the allowed ones", "[report]") {
  const fs::path dir = fs::temp_directory_path() / "kiln_test_report_files";
  fs::remove_all(dir);
  auto render = [](const std::string& f) { return "text of " + f; };
  const auto paths = kiln::report::write_files((dir / "sub").string(), "plan", {"md", "json"}, render);
  REQUIRE(paths.size() == 2);
  CHECK(read(paths[0]) == "text of md");
  CHECK(fs::path(paths[1]).filename() == "plan.json");
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir / "sub")) ++files;
  CHECK(files == 2);  // no temporary left behind
  try {
    kiln::report::write_files((dir / "other").string(), "reference", {"md", "csv"}, render, {"md", "json", "html"});
    FAIL("csv accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "--format: 'csv' is not md, json or html");
  }
  CHECK_FALSE(fs::exists(dir / "other"));  // refused before anything is written
  fs::remove_all(dir);
}

TEST_CASE("one HTML page for every report: escaped title, one stylesheet, the body as given", "[report]") {
  const std::string page = kiln::report::html_page("a <b>", "<p>x</p>\n");
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(page.find("<title>a &lt;b&gt;</title>") != std::string::npos);
  CHECK(page.find("<style>") == page.rfind("<style>"));
  CHECK(page.find("<body>\n<p>x</p>\n</body></html>\n") != std::string::npos);
}
