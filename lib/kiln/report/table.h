// Tables described once and rendered to every format. A table is a list of Column descriptions,
// each said once: its header, its text cell (Markdown, CSV and HTML) and its JSON key and value;
// the writers here render that one list in Markdown, CSV, HTML and JSON, so a column cannot drift
// between them. Generic: kiln-profile's reports (profile/report*.cpp) are its users.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::report {

using json = nlohmann::json;

template <class Row>
struct Column {
  std::string name{};                             // the header; "" = in the JSON only
  std::function<std::string(const Row&)> cell{};  // the text cell
  std::string key{};                              // the JSON key; "" = in the text formats only
  std::function<json(const Row&)> value{};        // without a key, an object whose fields join the row
  bool number = false;                            // right-aligned in an aligned Markdown table
  std::string html_class{};                       // the HTML cell's class
  bool strong = false;                            // Markdown: a non-empty cell in bold
  bool html = false;                              // in the HTML table only, its cell HTML already
};

// A field's JSON value: an empty optional is null.
template <class T>
json opt(const T& v) {
  return json(v);
}
template <class T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}
// A JSON object from keys and values: object("a", 1, "b", std::optional<double>()) = {"a": 1, "b": null}.
inline json object() {
  return json::object();
}
template <class V, class... Rest>
json object(const std::string& key, const V& value, const Rest&... rest) {
  json out = object(rest...);
  out[key] = opt(value);
  return out;
}

// `v` in the unit `prefix` names: 'G' v / 1e9, 'M' v / 1e6, 'm' v x 1e3, 'u' v x 1e6, '%' v x 100,
// anything else v itself.
double in_unit(double v, char prefix);
// A text cell: `format` of v in `prefix`'s unit, "n/a" for none. cell(bytes, 'G') is GB to 0.001,
// cell(seconds, 'm') ms, cell(fraction, '%', "{:.1f}%") a percentage.
std::string cell(const std::optional<double>& v, char prefix, const char* format = "{:.3f}");

// A number column: its cell `format` of get(row) in `prefix`'s unit, its JSON get(row) (no key:
// in the text formats only). `get` is a member pointer or a function of the row.
template <class Row, class Get>
Column<Row> number(std::string name, std::string key, char prefix, const char* format, Get get) {
  Column<Row> c{std::move(name),
                [=](const Row& r) { return fmt::format(fmt::runtime(format), in_unit(std::invoke(get, r), prefix)); },
                std::move(key),
                {},
                true};
  if (!c.key.empty()) c.value = [=](const Row& r) { return json(std::invoke(get, r)); };
  return c;
}
// A field of the JSON only.
template <class Row, class Get>
Column<Row> field(std::string key, Get get) {
  return {"", {}, std::move(key), [=](const Row& r) { return opt(std::invoke(get, r)); }};
}

std::string html_escape(const std::string& s);
std::string csv_field(const std::string& s);
std::string markdown_line(const std::vector<std::string>& cells);  // "| a | b |\n"

template <class Row>
std::vector<std::string> text_cells(const std::vector<Column<Row>>& columns, const Row* row, bool html = false) {
  std::vector<std::string> out;
  for (const Column<Row>& c : columns) {
    if (!c.name.empty() && (html || !c.html)) out.push_back(row ? c.cell(*row) : c.name);
  }
  return out;
}

// Markdown: all columns "---", or with `aligned` the numbers "---:".
template <class Row>
std::string markdown_table(const std::vector<Column<Row>>& columns, const std::vector<Row>& rows,
                           bool aligned = false) {
  std::vector<std::string> rule;
  for (const Column<Row>& c : columns) {
    if (!c.name.empty() && !c.html) rule.push_back(aligned && c.number ? "---:" : "---");
  }
  std::string out = markdown_line(text_cells<Row>(columns, nullptr)) + markdown_line(rule);
  for (const Row& r : rows) {
    std::vector<std::string> cells;
    for (const Column<Row>& c : columns) {
      if (c.name.empty() || c.html) continue;
      const std::string s = c.cell(r);
      cells.push_back(c.strong && !s.empty() ? "**" + s + "**" : s);
    }
    out += markdown_line(cells);
  }
  return out;
}

template <class Row>
std::string csv_table(const std::vector<Column<Row>>& columns, const std::vector<Row>& rows) {
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) out += ',';
      out += csv_field(cells[i]);
    }
    out += '\n';
  };
  line(text_cells<Row>(columns, nullptr));
  for (const Row& r : rows) line(text_cells(columns, &r));
  return out;
}

// `<table ...>` through `</table>` (no newline after it): the header in a <thead> and the rows in
// a <tbody> unless `bare`; with `row_class`, each <tr> its class; a cell reading OOM is class oom.
template <class Row>
std::string html_table(const std::string& open, const std::vector<Column<Row>>& columns, const std::vector<Row>& rows,
                       const std::function<std::string(const Row&)>& row_class = {}, bool bare = false) {
  std::string out = open + (bare ? "<tr>" : "<thead><tr>");
  for (const std::string& h : text_cells<Row>(columns, nullptr, true)) out += "<th>" + html_escape(h) + "</th>";
  out += bare ? "</tr>\n" : "</tr></thead><tbody>\n";
  for (const Row& r : rows) {
    out += row_class ? "<tr class=\"" + row_class(r) + "\">" : "<tr>";
    for (const Column<Row>& c : columns) {
      if (c.name.empty()) continue;
      const std::string s = c.cell(r), cls = s == "OOM" ? "oom" : c.html_class;
      out += (cls.empty() ? "<td>" : "<td class=\"" + cls + "\">") + (c.html ? s : html_escape(s)) + "</td>";
    }
    out += "</tr>\n";
  }
  return out + (bare ? "</table>" : "</tbody></table>");
}

template <class Row>
json json_row(const std::vector<Column<Row>>& columns, const Row& r) {
  json out = json::object();
  for (const Column<Row>& c : columns) {
    if (!c.value) continue;
    if (c.key.empty()) {
      out.update(c.value(r));
    } else {
      out[c.key] = c.value(r);
    }
  }
  return out;
}
template <class Row>
json json_rows(const std::vector<Column<Row>>& columns, const std::vector<Row>& rows) {
  json out = json::array();
  for (const Row& r : rows) out.push_back(json_row(columns, r));
  return out;
}

// A report's files: dir/<stem>.<format> for each of `formats` (md, csv, json, html), the directory
// created, each file written atomically (a temporary file and a rename) with render(format);
// returns the paths. A format not in `allowed` is an error naming it and the allowed ones.

std::vector<std::string> write_files(const std::string& dir, const std::string& stem,
                                     const std::vector<std::string>& formats,
                                     const std::function<std::string(const std::string&)>& render,
                                     const std::vector<std::string>& allowed = {"md", "csv", "json", "html"});

// A self-contained HTML page (no network): one stylesheet for every kiln report, `title` in its
// <title>, `body` as given.
std::string html_page(const std::string& title, const std::string& body);

}  // namespace kiln::report
