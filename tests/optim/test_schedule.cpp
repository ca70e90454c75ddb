// Learning-rate schedules against hand-computed values of HF's closed forms (transformers
// optimization.py: linear, cosine with min_lr, constant(+warmup), warmup-stable-decay).
#include <cmath>

#include <catch2/catch.hpp>

#include "kiln/optim/schedule.h"

using kiln::optim::lr_multiplier;
using kiln::optim::ScheduleConfig;

TEST_CASE("linear and constant schedules", "[optim][schedule]") {
  ScheduleConfig c{.type = "linear", .total_steps = 100, .warmup_steps = 10};
  CHECK(lr_multiplier(c, 0) == 0.0);
  CHECK(lr_multiplier(c, 5) == Approx(0.5));
  CHECK(lr_multiplier(c, 10) == Approx(1.0));
  CHECK(lr_multiplier(c, 55) == Approx(0.5));  // (100 - 55) / (100 - 10)
  CHECK(lr_multiplier(c, 100) == 0.0);
  c.type = "constant_with_warmup";
  CHECK(lr_multiplier(c, 3) == Approx(0.3));
  CHECK(lr_multiplier(c, 90) == 1.0);
  c.type = "constant";
  CHECK(lr_multiplier(c, 0) == 1.0);
}

TEST_CASE("cosine schedule with warmup and min_lr_ratio", "[optim][schedule]") {
  ScheduleConfig c{.type = "cosine", .total_steps = 100, .warmup_steps = 10, .min_lr_ratio = 0.1};
  CHECK(lr_multiplier(c, 5) == Approx(0.5));
  CHECK(lr_multiplier(c, 10) == Approx(1.0));
  CHECK(lr_multiplier(c, 55) == Approx(0.55));  // half way: 0.5 * (1 - 0.1) + 0.1
  CHECK(lr_multiplier(c, 100) == Approx(0.1));
  const double p = (70.0 - 10) / 90;
  CHECK(lr_multiplier(c, 70) == Approx(0.5 * (1 + std::cos(M_PI * p)) * 0.9 + 0.1));
  c.min_lr_ratio = 0;
  CHECK(lr_multiplier(c, 100) == Approx(0.0).margin(1e-12));
}

TEST_CASE("warmup-stable-decay schedule", "[optim][schedule]") {
  ScheduleConfig c{
      .type = "warmup_stable_decay", .total_steps = 100, .warmup_steps = 10, .min_lr_ratio = 0.2, .decay_ratio = 0.2};
  CHECK(lr_multiplier(c, 5) == Approx(0.5));
  CHECK(lr_multiplier(c, 50) == 1.0);  // stable from 10 to 80
  CHECK(lr_multiplier(c, 80) == Approx(1.0));
  CHECK(lr_multiplier(c, 90) == Approx(0.5 * 0.8 + 0.2));  // half-way down the cosine
  CHECK(lr_multiplier(c, 100) == Approx(0.2));
}

TEST_CASE("warmup steps from warmup_ratio round up as in HF", "[optim][schedule]") {
  CHECK(kiln::optim::resolve_warmup_steps(0, 0.1, 309852) == 30986);
  CHECK(kiln::optim::resolve_warmup_steps(0, 0.1, 6197892) == 619790);  // ceil(619789.2)
  CHECK(kiln::optim::resolve_warmup_steps(7, 0.1, 1000) == 7);
  CHECK_THROWS_AS(lr_multiplier({.type = "poly"}, 1), std::invalid_argument);
}
