// The backend spec string of ops/dispatch.h: its documented grammar, checked item by item.
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "kiln/cost/plan.h"
#include "kiln/ops/dispatch.h"
#include "kiln/profile/sweep.h"
#include "kiln/train/pretrain_config.h"
#include "support.h"

using kiln::ops::Backend;
using kiln::ops::Op;

TEST_CASE("backend specs set a default and per-op overrides", "[ops][dispatch]") {
  kiln::ops::set_backends("aten,rope=kiln,linear_ce=kiln");
  CHECK(kiln::ops::backend() == Backend::kAten);
  CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kAten);
  CHECK(kiln::ops::backend(Op::kRope) == Backend::kKiln);
  CHECK(kiln::ops::backend(Op::kLinearCrossEntropy) == Backend::kKiln);
  CHECK(kiln::ops::backends_spec() == "aten,rope=kiln,linear_ce=kiln");
  kiln::ops::set_backends("kiln,attention=aten");
  CHECK(kiln::ops::backend(Op::kAttention) == Backend::kAten);
  CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kKiln);
  kiln::ops::set_backends("swiglu=aten");  // no bare item: on top of the default (kDefaultKernels)
  CHECK(kiln::ops::backend(Op::kSwiGlu) == Backend::kAten);
  CHECK(kiln::ops::backend(Op::kRope) == Backend::kKiln);
  CHECK(kiln::ops::backend(Op::kAttention) == Backend::kAten);
  CHECK(kiln::ops::backends_spec() == "kiln,swiglu=aten,attention=aten");
  kiln::ops::set_backends("attention=kiln");
  CHECK(kiln::ops::backend(Op::kAttention) == Backend::kKiln);
  kiln::ops::set_backend(Backend::kKiln);  // clears overrides
  CHECK(kiln::ops::backends_spec() == "kiln");
  CHECK(kiln::ops::backend(Op::kAttention) == Backend::kKiln);  // a bare "kiln": every op, attention too
}

TEST_CASE("the default kernels: kiln's everywhere but attention, which is SDPA until kiln's pays", "[ops][dispatch]") {
  CHECK(std::string(kiln::ops::kDefaultKernels) == "kiln,attention=aten");
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i) {
    const auto op = static_cast<Op>(i);
    CAPTURE(kiln::ops::op_name(op));
    const Backend want = op == Op::kAttention ? Backend::kAten : Backend::kKiln;
    CHECK(kiln::ops::backend_in_spec(kiln::ops::kDefaultKernels, op) == want);
    CHECK(kiln::ops::backend_in_spec("rope=kiln", op) == want);  // no bare item: the default's choices
    CHECK(kiln::ops::backend_in_spec("kiln", op) == Backend::kKiln);
    const kiln::ops::BackendScope scope(kiln::ops::kDefaultKernels);
    CHECK(kiln::ops::backend(op) == want);
  }
  // The programs' defaults are this spec (kiln-profile's, kiln-pretrain's, the planner's string).
  CHECK(kiln::train::PretrainConfig{}.kernels == kiln::ops::kDefaultKernels);
  CHECK(kiln::profile::ProfileSettings{}.run.kernels == kiln::ops::kDefaultKernels);
  CHECK(kiln::cost::PlanConfig{}.kernels == kiln::ops::kDefaultKernels);
}

TEST_CASE("bad backend specs are rejected and change nothing", "[ops][dispatch]") {
  kiln::ops::set_backend(Backend::kKiln);
  CHECK_THAT(kiln::test::error_of([] { kiln::ops::set_backends("kiln,softmax=aten"); }),
             Catch::Matchers::Contains("unknown op 'softmax'"));
  CHECK_THAT(kiln::test::error_of([] { kiln::ops::set_backends("rope=cuda"); }),
             Catch::Matchers::Contains("got 'cuda'"));
  CHECK_THAT(kiln::test::error_of([] { kiln::ops::set_backends("rope=aten,aten"); }),
             Catch::Matchers::Contains("only the first item"));
  CHECK_THAT(kiln::test::error_of([] { kiln::ops::set_backends(""); }), Catch::Matchers::Contains("empty"));
  CHECK(kiln::ops::backends_spec() == "kiln");
}

TEST_CASE("a BackendScope holds for its thread only and nests", "[ops][dispatch]") {
  kiln::ops::set_backend(Backend::kKiln);
  {
    const kiln::ops::BackendScope outer("aten,rope=kiln");
    CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kAten);
    CHECK(kiln::ops::backend(Op::kRope) == Backend::kKiln);
    CHECK(kiln::ops::effective_backends_spec() == "aten,rope=kiln");
    CHECK(kiln::ops::backends_spec() == "kiln");  // the process-wide setting is untouched
    // Another thread sees the process-wide setting, and its own scope does not leak back.
    std::thread other([] {
      CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kKiln);
      const kiln::ops::BackendScope mine("kiln,swiglu=aten");
      CHECK(kiln::ops::backend(Op::kSwiGlu) == Backend::kAten);
    });
    other.join();
    CHECK(kiln::ops::backend(Op::kSwiGlu) == Backend::kAten);  // outer's default
    {
      const kiln::ops::BackendScope inner("kiln");
      CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kKiln);
    }
    CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kAten);
    CHECK_THROWS_WITH(kiln::ops::BackendScope("kiln,softmax=aten"), Catch::Matchers::Contains("softmax"));
    CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kAten);  // a bad scope changes nothing
  }
  CHECK(kiln::ops::backend(Op::kRmsNorm) == Backend::kKiln);
  CHECK(kiln::ops::effective_backends_spec() == "kiln");
}
