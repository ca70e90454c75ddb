// The profile report's counter columns, per-component tables and roofline chart, from a report
// built here by hand (no step runs): the cells say counted beside modelled, or modelled marked as
// such; the JSON carries both fields and the reason; a point's components are the traffic model's
// rows; the roofline SVG has the roof, the ridge, a dot per component and per measured step; a
// peak violation is a warning line; the charts' axes tick at round numbers.
#include <regex>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "kiln/cost/hardware.h"
#include "kiln/cost/traffic.h"
#include "kiln/model/llama_config.h"
#include "kiln/profile/report.h"
#include "kiln/profile/report_internal.h"
#include "kiln/profile/sweep.h"
#include "kiln/report/chart.h"

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

kiln::profile::SweepReport made_up_report() {
  using namespace kiln;
  profile::SweepReport report;
  report.config.run.model = "tiny";
  report.config.dtype = "bf16";
  report.model = model::load_llama_config("tiny");
  report.device = "cuda:0 (NVIDIA A100-SXM4-80GB)";
  report.peak_tflops = 312;
  report.peak_source = "datasheet";
  report.machine.spec = cost::hardware_spec("A100-80GB");
  report.roofline = cost::roofline(*report.machine.spec, "bf16");
  report.machine.bandwidth_source = report.machine.spec->source;
  report.counters_note = "counted: test";
  profile::ProfileRow row;
  row.point = {2, 1, 64};
  row.seconds_per_step = 0.01;
  row.tokens_per_second = 128 / 0.01;
  const profile::SweepPoint point = row.point;
  const cost::TrafficReport traffic = cost::traffic_model(
      report.model, profile::point_run(report.config, report.model, point,
                                       kiln::train::RunTarget{.cuda = true, .hardware = report.machine.spec}));
  row.components = profile::component_rows(traffic, *report.roofline);
  row.modelled_step_seconds = cost::modelled_step_seconds(traffic, *report.roofline);
  row.executed_flops = traffic.kiln_step().flops();
  row.traffic_bytes = traffic.kiln_step().bytes;
  row.memory_bandwidth = {0.382, 0.41, ""};
  row.tensor_core = {0.05, std::nullopt, "n/a: CUPTI: restricted to admin users"};
  row.fp_engine = {std::nullopt, std::nullopt, "not counted"};
  report.rows.push_back(row);
  report.warnings.push_back("BUG: MFU 104.2% exceeds 100% of the peak");
  return report;
}

}  // namespace

TEST_CASE("counter columns: counted beside modelled, modelled marked, n/a without either", "[profile]") {
  const auto report = made_up_report();
  const auto header = kiln::profile::table_header(report);
  const auto rows = kiln::profile::table_rows(report);
  auto column = [&](const std::string& name) {
    return rows[0][static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin())];
  };
  CHECK(column("memory bandwidth") == "41.0% (model 38.2%)");
  CHECK(column("tensor core") == "5.0% (model)");
  CHECK(column("fp engine") == "n/a");

  const auto doc = nlohmann::json::parse(kiln::profile::to_json(report));
  const auto& r = doc["rows"][0];
  CHECK(r["memory_bandwidth_modelled"].get<double>() == Approx(0.382));
  CHECK(r["memory_bandwidth_counted"].get<double>() == Approx(0.41));
  CHECK(r["memory_bandwidth_counted_reason"].is_null());
  CHECK(r["tensor_core_counted"].is_null());
  CHECK(r["tensor_core_counted_reason"] == "n/a: CUPTI: restricted to admin users");
  CHECK(r["fp_engine_modelled"].is_null());
  CHECK(doc["warnings"].size() == 1);
  CHECK(doc["roofline"]["ridge"].get<double>() == Approx(312e12 / 2039e9));
  // The components are the traffic model's rows: their bytes sum to the step's.
  double bytes = 0;
  for (const auto& c : r["components"]) bytes += c["bytes"].get<double>();
  CHECK(bytes == Approx(report.rows[0].traffic_bytes));
  CHECK(r["components"].size() == report.rows[0].components.size());
  CHECK(r["components"][0]["measured_seconds"].is_null());
}

TEST_CASE("Markdown and CSV carry the per-component table and the warning", "[profile]") {
  const auto report = made_up_report();
  const std::string md = kiln::profile::to_markdown(report);
  CHECK(md.find("WARNING: BUG: MFU 104.2%") != std::string::npos);
  CHECK(md.find("### Components: cutoff_len 64, batch 2, gradient_accumulation_steps 1") != std::string::npos);
  CHECK(md.find("| q_proj | fwd |") != std::string::npos);
  CHECK(md.find("ridge point 153 FLOP/byte") != std::string::npos);
  const std::string csv = kiln::profile::to_components_csv(report);
  CHECK(count(csv, "\n") == 1 + report.rows[0].components.size());
  CHECK(csv.find("64,2,1,q_proj,fwd,2,") != std::string::npos);  // 2 layers x 1 micro-batch
}

TEST_CASE("the sections after the table say the same in Markdown and HTML", "[profile]") {
  auto report = made_up_report();
  // A measured scope that merges traffic-model rows (a fused Function's), and one that matches.
  kiln::profile::ComponentTimes times;
  times.seconds[{"SwiGLU + down_proj", "fwd"}] = 0.0025;
  times.seconds[{"q_proj", "fwd"}] = 0.001;
  report.rows[0].component_times = times;
  const std::string md = kiln::profile::to_markdown(report), html = kiln::profile::to_html(report);
  for (const std::string& text :
       {std::string("Memory traffic and FLOPs per component"),
        std::string("Components: cutoff_len 64, batch 2, gradient_accumulation_steps 1 (per step: measured"),
        std::string(
            "Measured in scopes that merge the rows above (fused Functions): SwiGLU + down_proj (fwd) 2.500 ms")}) {
    CHECK(md.find(text) != std::string::npos);
    CHECK(html.find(text) != std::string::npos);
  }
  CHECK(md.find("SwiGLU + down_proj (fwd) 2.500 ms\n") != std::string::npos);  // the last entry ends the line
  CHECK(html.find("q_proj (fwd) 1.000 ms") == std::string::npos);              // a matched row is in its table
}

// The sweep once built a point's component rows after its counted kernels had been placed on them,
// so no row ever kept its counted bytes; add_measurements runs on the finished rows.
TEST_CASE("a point's measurements reach its component rows: profiled time, counted bytes per step", "[profile]") {
  using namespace kiln::profile;
  auto report = made_up_report();
  std::vector<ComponentRow>& rows = report.rows[0].components;
  ComponentTimes times;
  times.seconds[{"q_proj", "fwd"}] = 0.002;
  times.seconds[{"SwiGLU + down_proj", "recompute"}] = 0.001;  // no row of its own
  CounterReading reading;
  reading.components.resize(3);
  reading.components[0].name = "q_proj", reading.components[0].pass = "fwd", reading.components[0].dram_bytes = 6e6;
  reading.components[1].name = "q_proj", reading.components[1].pass = "bwd";  // counted no bytes
  reading.components[2].name = "o_proj", reading.components[2].pass = "step", reading.components[2].dram_bytes = 1;
  add_measurements(rows, times, reading, 3);
  int measured = 0, counted = 0;
  for (const ComponentRow& r : rows) {
    INFO(r.component << " " << r.pass);
    const bool q_fwd = r.component == "q_proj" && r.pass == "fwd";
    CHECK(r.measured_seconds.has_value() == q_fwd);
    CHECK(r.counted_bytes.has_value() == q_fwd);
    measured += r.measured_seconds ? 1 : 0;
    counted += r.counted_bytes ? 1 : 0;
    if (q_fwd) {
      CHECK(*r.measured_seconds == 0.002);
      CHECK(*r.counted_bytes == 2e6);  // 6 MB over 3 counted steps
    }
  }
  CHECK(measured == 1);
  CHECK(counted == 1);
  const auto unmatched = unmatched_component_times(times, rows);
  REQUIRE(unmatched.size() == 1);
  CHECK(std::get<0>(unmatched[0]) == "SwiGLU + down_proj");
  // The Markdown's component table shows the counted megabytes in q_proj's forward row.
  const std::string md = to_markdown(report);
  const size_t at = md.find("| q_proj | fwd |");
  REQUIRE(at != std::string::npos);
  CHECK(md.substr(at, md.find('\n', at) - at).find("| 2.000 |") != std::string::npos);
}

TEST_CASE("the roofline chart: roof, ridge, one dot per component with work and per measured step", "[profile]") {
  const auto report = made_up_report();
  const std::string html = kiln::profile::to_html(report);
  CHECK(count(html, R"(id="chart-roofline")") == 1);
  CHECK(count(html, R"(class="roof" data-roof="gemm")") == 1);
  CHECK(count(html, R"(class="roof" data-roof="vector")") == 1);  // A100: FP32 units' roof below the tensor cores'
  CHECK(count(html, R"(class="ridge")") == 1);
  size_t with_work = 0;
  for (const auto& c : report.rows[0].components) with_work += c.intensity > 0 && c.gemm_flops + c.other_flops > 0;
  CHECK(with_work > 10);
  CHECK(count(html, R"(class="roofline-component")") == with_work);
  CHECK(count(html, R"(class="roofline-step")") == 1);
  CHECK(html.find(R"(class="warning")") != std::string::npos);
  CHECK(count(html, R"(<details class="components">)") == 1);
}

TEST_CASE("chart axes tick at 1-2-5 steps, labelled with SI prefixes", "[profile][report]") {
  using namespace kiln::report;
  auto same = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]));
  };
  same(linear_ticks(0, 10260), {0, 5000, 10000, 15000});               // tokens/s up to 9771 x 1.05
  same(linear_ticks(16, 64), {10, 20, 30, 40, 50, 60, 70});            // cutoff_len 16 to 64
  same(linear_ticks(0, 0.0131), {0, 0.005, 0.01, 0.015});              // not 0.0131
  same(log_ticks(64, 4096), {50, 100, 200, 500, 1000, 2000, 5000});    // 1, 2, 5 in each decade
  same(log_ticks(0.05, 5e4), {0.01, 0.1, 1, 10, 100, 1e3, 1e4, 1e5});  // decades over more than three
  CHECK(si(0, 5000) == "0");
  CHECK(si(15000, 5000) == "15k");
  CHECK(si(1.5e9, 5e8) == "1.5G");
  CHECK(si(1e9, 5e8) == "1G");
  CHECK(si(0.02, 0.01) == "0.02");
  CHECK(si(0.3 * (1 + 1e-16), 0.1) == "0.3");
  CHECK(si(1020, 20) == "1.02k");
  CHECK(si(5e-4, 1e-4) == "500u");
  CHECK(si(32400, 324) == "32.4k");  // not 3.24e+04
  CHECK(si(2.039e12, 2.039e10, "B/s") == "2.04 TB/s");

  // Every axis label of the report's charts: an integer or decimal, at most two significant
  // digits here, with an SI prefix.
  const std::string html = kiln::profile::to_html(made_up_report());
  const std::regex label(R"re(data-axis="[xy]">([^<]*)<)re"),
      round(R"re(-?(0\.0*[1-9][0-9]?|[1-9](\.[0-9]|[0-9]?0*))[kMGTPmun]?|0)re");
  size_t labels = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), label); it != std::sregex_iterator(); ++it, ++labels) {
    INFO((*it)[1].str());
    CHECK(std::regex_match((*it)[1].str(), round));
  }
  CHECK(labels > 20);
}
