// Learning-rate schedules against hand-computed values of HF's closed forms (transformers
// optimization.py), and against transformers' get_scheduler itself at every step of a run
// (fixtures/hf_schedules.json, written by fixtures/make_hf_schedules.py).
#include <cmath>
#include <fstream>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

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
  // transformers 5.6, training_args.py:2111-2113: int(w) if w >= 1 else math.ceil(total * w).
  CHECK(kiln::optim::resolve_warmup_steps(0.1, 309852) == 30986);
  CHECK(kiln::optim::resolve_warmup_steps(0.1, 6197892) == 619790);  // ceil(619789.2)
  CHECK(kiln::optim::resolve_warmup_steps(7, 1000) == 7);
  CHECK(kiln::optim::resolve_warmup_steps(2.5, 1000) == 2);  // int(2.5)
  CHECK(kiln::optim::resolve_warmup_steps(1.0, 1000) == 1);
  CHECK(kiln::optim::resolve_warmup_steps(0, 1000) == 0);
  CHECK_THROWS_AS(lr_multiplier({.type = "poly"}, 1), std::invalid_argument);
}

TEST_CASE("hand values of the other HF schedules", "[optim][schedule]") {
  ScheduleConfig c{.type = "cosine", .total_steps = 100, .warmup_steps = 0};
  c.kwargs.numbers["num_cycles"] = 1.0;  // a full wave: back to 1 at the end
  CHECK(lr_multiplier(c, 50) == Approx(0.0).margin(1e-12));
  CHECK(lr_multiplier(c, 100) == Approx(1.0));
  c.type = "cosine_with_restarts";
  c.kwargs.numbers["num_cycles"] = 2.0;  // two half waves, each from 1
  CHECK(lr_multiplier(c, 25) == Approx(0.5));
  CHECK(lr_multiplier(c, 50) == Approx(1.0));
  CHECK(lr_multiplier(c, 100) == 0.0);
  c = ScheduleConfig{.type = "polynomial", .total_steps = 100, .warmup_steps = 10, .initial_lr = 2e-4};
  c.kwargs.numbers = {{"lr_end", 2e-5}, {"power", 2.0}};
  CHECK(lr_multiplier(c, 5) == Approx(0.5));
  CHECK(lr_multiplier(c, 55) == Approx((1.8e-4 * 0.25 + 2e-5) / 2e-4));  // half way: (1/2)^2 of the range left
  CHECK(lr_multiplier(c, 100) == Approx(0.1));
  c = ScheduleConfig{.type = "inverse_sqrt", .total_steps = 100, .warmup_steps = 4};
  CHECK(lr_multiplier(c, 2) == Approx(0.5));
  CHECK(lr_multiplier(c, 16) == Approx(0.5));  // timescale = warmup: 1 / sqrt(16 / 4)
  c.warmup_steps = 0;
  CHECK(lr_multiplier(c, 30'000) == Approx(0.5));  // timescale 10000: 1 / sqrt(40000 / 10000)
  c.kwargs.numbers["timescale"] = 9;
  CHECK(lr_multiplier(c, 27) == Approx(0.5));
  c = ScheduleConfig{.type = "cosine_with_min_lr", .total_steps = 100, .warmup_steps = 0, .initial_lr = 1e-3};
  c.kwargs.numbers["min_lr"] = 1e-4;
  CHECK(lr_multiplier(c, 50) == Approx(0.55));
  CHECK(lr_multiplier(c, 100) == Approx(0.1));
  c.type = "cosine_warmup_with_min_lr";  // warmup from 1/warmup, the decay one step ahead
  c.warmup_steps = 10;
  CHECK(lr_multiplier(c, 0) == Approx(0.1));
  CHECK(lr_multiplier(c, 9) == Approx(1.0));
  CHECK(lr_multiplier(c, 54) == Approx(0.55));
  CHECK(lr_multiplier(c, 99) == Approx(0.1));
  c.kwargs.numbers["warmup_lr_rate"] = 0.1;
  CHECK(lr_multiplier(c, 0) == Approx(0.1));
  CHECK(lr_multiplier(c, 9) == Approx(1.0));  // 0.1 + 0.9 * 9 / 9
}

TEST_CASE("warmup_stable_decay: LLaMA-Factory's split and HF's kwargs", "[optim][schedule]") {
  // No kwargs and no decay_ratio: a third of the 90 steps after warmup stable, 60 decaying.
  ScheduleConfig c{.type = "warmup_stable_decay", .total_steps = 100, .warmup_steps = 10};
  CHECK(lr_multiplier(c, 39) == 1.0);
  CHECK(lr_multiplier(c, 70) == Approx(0.5));  // half way down the cosine
  CHECK(lr_multiplier(c, 100) == 0.0);
  // num_decay_steps alone: num_stable_steps still LLaMA-Factory's 30; the rest at the floor.
  c.kwargs.numbers = {{"num_decay_steps", 20}, {"min_lr_ratio", 0.1}};
  c.kwargs.strings = {{"decay_type", "linear"}, {"warmup_type", "cosine"}};
  CHECK(lr_multiplier(c, 0) == Approx(0.1));  // HF's min_lr_ratio lifts warmup too
  CHECK(lr_multiplier(c, 5) == Approx(0.55));
  CHECK(lr_multiplier(c, 50) == Approx(0.55));  // 10 + 30 + half of 20
  CHECK(lr_multiplier(c, 60) == Approx(0.1));
  c.kwargs.strings["decay_type"] = "1-sqrt";
  CHECK(lr_multiplier(c, 45) == Approx((1 - std::sqrt(0.25)) * 0.9 + 0.1));
}

TEST_CASE("kiln's schedule keys are HF's kwargs", "[optim][schedule]") {
  ScheduleConfig kiln{.type = "cosine", .total_steps = 50, .warmup_steps = 5, .min_lr_ratio = 0.1};
  ScheduleConfig hf{.type = "cosine_with_min_lr", .total_steps = 50, .warmup_steps = 5};
  hf.kwargs.numbers["min_lr_rate"] = 0.1;
  ScheduleConfig legacy{.type = "warmup_stable_decay", .total_steps = 50, .warmup_steps = 5, .decay_ratio = 0.2};
  ScheduleConfig counts{.type = "warmup_stable_decay", .total_steps = 50, .warmup_steps = 5};
  counts.kwargs.numbers = {{"num_stable_steps", 35}, {"num_decay_steps", 10}};  // round(0.2 * 50)
  for (int64_t s = 0; s <= 50; ++s) {
    CHECK(lr_multiplier(kiln, s) == lr_multiplier(hf, s));
    CHECK(lr_multiplier(legacy, s) == lr_multiplier(counts, s));
  }
}

TEST_CASE("checks: kwargs of the type, HF's refusals", "[optim][schedule]") {
  auto key_of = [](ScheduleConfig c) {
    try {
      kiln::optim::check_schedule(c);
    } catch (const kiln::optim::ScheduleError& e) {
      return e.key;
    }
    return std::string();
  };
  ScheduleConfig c{.type = "linear"};
  CHECK(key_of(c).empty());
  c.kwargs.numbers["num_cycles"] = 2;
  CHECK(key_of(c) == "lr_scheduler_kwargs.num_cycles");
  c.type = "cosine";
  CHECK(key_of(c).empty());
  c.type = "reduce_lr_on_plateau";
  CHECK(key_of(c) == "lr_scheduler_type");
  c = ScheduleConfig{.type = "cosine_with_min_lr"};
  CHECK(key_of(c) == "lr_scheduler_kwargs");
  c.kwargs.numbers = {{"min_lr", 0.1}, {"min_lr_rate", 0.1}};
  CHECK(key_of(c) == "lr_scheduler_kwargs.min_lr_rate");
  c = ScheduleConfig{.type = "polynomial", .initial_lr = 1e-4};
  c.kwargs.numbers["lr_end"] = 1e-3;
  CHECK(key_of(c) == "lr_scheduler_kwargs.lr_end");
  c = ScheduleConfig{.type = "warmup_stable_decay", .decay_ratio = 0.1};
  CHECK(key_of(c).empty());
  c.kwargs.numbers["num_decay_steps"] = 3;
  CHECK(key_of(c) == "decay_ratio");
  c = ScheduleConfig{.type = "warmup_stable_decay"};
  c.kwargs.strings["decay_type"] = "exp";
  CHECK(key_of(c) == "lr_scheduler_kwargs.decay_type");
}

TEST_CASE("every schedule equals transformers' get_scheduler at every step", "[optim][schedule]") {
  std::ifstream in(KILN_OPTIM_FIXTURES "/hf_schedules.json");
  REQUIRE(in.good());
  const auto fixture = nlohmann::json::parse(in);
  std::set<std::string> types;
  for (const auto& tc : fixture["cases"]) {
    ScheduleConfig c{.type = tc["type"].get<std::string>(),
                     .total_steps = tc["total_steps"].get<int64_t>(),
                     .warmup_steps = tc["warmup_steps"].get<int64_t>(),
                     .initial_lr = tc["lr"].get<double>()};
    for (const auto& [key, value] : tc["kwargs"].items()) {
      if (value.is_string()) {
        c.kwargs.strings[key] = value.get<std::string>();
      } else {
        c.kwargs.numbers[key] = value.get<double>();
      }
    }
    INFO(tc["type"].get<std::string>() << " warmup " << c.warmup_steps << " kwargs " << tc["kwargs"].dump());
    REQUIRE_NOTHROW(kiln::optim::check_schedule(c));
    const auto& expected = tc["multipliers"];
    REQUIRE(expected.size() == static_cast<size_t>(c.total_steps + 1));
    for (int64_t s = 0; s <= c.total_steps; ++s) {
      INFO("step " << s);
      CHECK(lr_multiplier(c, s) == Approx(expected[s].get<double>()).margin(1e-9).epsilon(0));
    }
    types.insert(c.type);
  }
  CHECK(types.size() == kiln::optim::schedule_types().size());
}
