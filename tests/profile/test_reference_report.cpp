// kiln-profile reference (profile/reference_report.h): the reference runs' rows predicted from the
// data file and host costs compiled into the library. The per-row ratios (predicted / measured step
// time and nvidia-smi memory) are pinned: a change to the traffic, memory, allocator or host models,
// or to the data files, that moves any row fails here and must say why in its commit (and update
// docs/performance.md, "The reference runs, predicted").
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "kiln/config/yaml.h"
#include "kiln/profile/reference_report.h"

namespace {

struct Pin {
  const char* table;
  int64_t cutoff_len, batch, accumulation;
  double speed, memory;  // predicted / measured
};

// The ratios of the data files as committed (2026-12-06: host costs measured on this project's
// 2-core Xeon, configs/reference/host_costs.yaml).
const Pin kPins[] = {
    {"100M model, one V100 (fp16)", 1, 1, 1, 0.842, 0.953},
    {"100M model, one V100 (fp16)", 64, 1, 1, 0.829, 0.936},
    {"100M model, one V100 (fp16)", 128, 1, 1, 0.809, 0.840},
    {"100M model, one V100 (fp16)", 256, 1, 1, 0.809, 0.807},
    {"100M model, one V100 (fp16)", 512, 1, 1, 0.809, 0.851},
    {"100M model, one V100 (fp16)", 1024, 1, 1, 0.803, 0.830},
    {"100M model, one V100 (fp16)", 2048, 1, 1, 0.589, 0.839},
    {"100M model, one V100 (fp16)", 4096, 1, 1, 0.464, 1.046},
    {"100M model, one V100 (fp16)", 8192, 1, 1, 0.424, 0.844},
    {"100M model, one V100 (fp16)", 1024, 1, 8, 0.798, 0.935},
    {"100M model, one V100 (fp16)", 1024, 1, 16, 0.721, 0.935},
    {"100M model, one V100 (fp16)", 1024, 12, 1, 0.522, 1.077},
    {"100M model, one V100 (fp16)", 1024, 8, 1, 0.526, 0.811},
    {"100M model, one V100 (fp16)", 1024, 8, 8, 0.481, 1.070},
    {"100M model, one V100 (fp16)", 1024, 8, 16, 0.499, 1.070},
    {"100M model, one A100", 1024, 8, 1, 0.499, 0.811},
    {"100M model, one A100", 1024, 8, 8, 0.438, 1.024},
    {"1B model, one A100 (fp32)", 1024, 16, 1, 0.946, 1.148},
};

}  // namespace

TEST_CASE("reference runs: every row's predicted / measured ratios, pinned", "[profile][reference]") {
  const auto report = kiln::profile::reference_report();
  REQUIRE(report.rows.size() == std::size(kPins));
  int speed_within = 0, memory_within = 0;
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const auto& r = report.rows[i];
    const Pin& p = kPins[i];
    INFO(r.table << " " << r.cutoff_len << " x " << r.batch << " x " << r.accumulation);
    CHECK(r.table == p.table);
    CHECK(r.cutoff_len == p.cutoff_len);
    CHECK(r.batch == p.batch);
    CHECK(r.accumulation == p.accumulation);
    CHECK(*r.speed_ratio() == Approx(p.speed).margin(0.0015));
    CHECK(*r.memory_ratio() == Approx(p.memory).margin(0.0015));
    speed_within += r.speed_within() ? 1 : 0;
    memory_within += r.memory_within() ? 1 : 0;
    // Every figure outside its tolerance names what the model lacks.
    CHECK(r.misses.size() == (r.speed_within() ? 0u : 1u) + (r.memory_within() ? 0u : 1u));
    // kiln's own step for the same work is predicted faster than the reference stack's.
    CHECK(r.kiln.seconds < r.predicted.seconds);
  }
  CHECK(speed_within == 9);
  CHECK(memory_within == 9);
  CHECK(report.unmeasured.size() == 1);
}

TEST_CASE("reference runs: the data file's speeds and errors", "[profile][reference]") {
  CHECK(kiln::profile::parse_speed_seconds("12.9 it/s") == Approx(1 / 12.9));
  CHECK(kiln::profile::parse_speed_seconds("1.2 s/it") == Approx(1.2));
  CHECK_THROWS_WITH(kiln::profile::parse_speed_seconds("fast"), Catch::Contains("is not '<number> it/s'"));
  CHECK_THROWS_WITH(kiln::profile::parse_speed_seconds("3 it/min"), Catch::Contains("unit 'it/min'"));
  CHECK_THROWS_AS(kiln::profile::reference_report("/nonexistent/runs.yaml"), kiln::config::ConfigError);
}
