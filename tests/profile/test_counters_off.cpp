// A build without kiln-profile's hardware counters (-DKILN_PROFILE_COUNTERS=OFF; compiled instead of
// test_counters.cpp there): lib/kiln/profile/counters/counters.h still links, and every session,
// on any device and with any options, is unavailable and says why in its reading's columns.
#include <string>

#include <catch2/catch.hpp>

#include "kiln/profile/counters/counters.h"

using Catch::Matchers::Equals;
using kiln::profile::CounterOptions;
using kiln::profile::CounterReading;
using kiln::profile::CounterSession;

TEST_CASE("a build without KILN_PROFILE_COUNTERS: every counter session says so", "[profile][counters]") {
  const std::string why = "n/a: kiln was built without KILN_PROFILE_COUNTERS";
  for (const c10::Device device : {c10::Device(c10::kCPU), c10::Device(c10::kCUDA, 0), c10::Device(c10::kMeta)}) {
    for (const bool per_kernel : {false, true}) {
      INFO(device << (per_kernel ? " per kernel" : ""));
      auto session = CounterSession::open(device, 1e12, CounterOptions{.per_kernel = per_kernel, .phases = true});
      REQUIRE(session);
      CHECK_FALSE(session->available());
      CHECK_THAT(session->reason(), Equals(why));
      session->start();
      session->phase("forward");
      const CounterReading r = session->stop();
      CHECK(r.source.empty());
      CHECK(r.reason == why);
      CHECK(r.memory_reason == why);
      CHECK(r.tensor_reason == why);
      CHECK(r.fp_reason == why);
      CHECK_FALSE(r.memory_bandwidth);
      CHECK(r.phases.empty());
      CHECK(r.seconds >= 0);
    }
  }
}
