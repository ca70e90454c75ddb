// common/env.h (one reader for every environment variable, one parse rule per kind, the overrides
// tests set) and common/dtype_names.h (the one dtype-name table). The test hooks of ops/ are
// overrides of their variables: forcing a path and setting the variable must give one answer.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "kiln/common/dtype_names.h"
#include "kiln/common/env.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"

#include "support.h"

using Catch::Matchers::Contains;

namespace {

constexpr const char* kVar = "KILN_TEST_ENV_VARIABLE";

}  // namespace

TEST_CASE("env: one parse rule per kind, errors naming the variable and the value", "[common][env]") {
  namespace env = kiln::env;
  for (const char* yes : {"1", "true", "TRUE", "yes", "On"}) {
    const env::Override o(kVar, yes);
    CHECK(env::flag(kVar) == true);
  }
  for (const char* no : {"0", "false", "No", "off"}) {
    const env::Override o(kVar, no);
    CHECK(env::flag(kVar) == false);
  }
  {
    const env::Override o(kVar, "maybe");
    CHECK(kiln::test::error_of<std::invalid_argument>([] { env::flag(kVar); }) ==
          "KILN_TEST_ENV_VARIABLE=maybe: expected 1 or 0 (true/false, yes/no, on/off)");
    CHECK_THAT(kiln::test::error_of<std::invalid_argument>([] { env::integer(kVar, 0, 9); }),
               Contains("KILN_TEST_ENV_VARIABLE=maybe: expected an integer"));
    CHECK(kiln::test::error_of<std::invalid_argument>([] {
            env::choice(kVar, {"kernel", "user"});
          }) == "KILN_TEST_ENV_VARIABLE=maybe: expected kernel or user");
  }
  {
    const env::Override o(kVar, "75");
    CHECK(env::integer(kVar, 70, 200) == 75);
    CHECK(kiln::test::error_of<std::invalid_argument>([] {
            env::integer(kVar, 80, 200, "a compute capability times ten");
          }) == "KILN_TEST_ENV_VARIABLE=75: expected an integer from 80 to 200 (a compute capability times ten)");
  }
  for (const char* bad : {"7x", " 7", "", "1e2"}) {
    const env::Override o(kVar, bad);
    if (*bad == '\0') {
      CHECK_FALSE(env::integer(kVar, 0, 1000).has_value());  // empty: unset
    } else {
      CHECK_FALSE(kiln::test::error_of<std::invalid_argument>([] { env::integer(kVar, 0, 1000); }).empty());
    }
  }
  // Unset and empty are the same for kiln's rule; raw() keeps "" for other programs' protocols.
  const env::Override empty(kVar, "");
  CHECK_FALSE(env::string(kVar).has_value());
  CHECK_FALSE(env::flag(kVar).has_value());
  CHECK(env::raw(kVar) == std::string());
}

TEST_CASE("env: an override wins over the process environment, nests and restores", "[common][env]") {
  namespace env = kiln::env;
  ::setenv(kVar, "from-the-environment", 1);
  CHECK(env::string(kVar) == "from-the-environment");
  {
    const env::Override outer(kVar, "outer");
    CHECK(env::string(kVar) == "outer");
    {
      const env::Override unset(kVar, std::nullopt);  // reads as unset whatever the environment says
      CHECK_FALSE(env::raw(kVar).has_value());
    }
    CHECK(env::string(kVar) == "outer");
  }
  CHECK(env::string(kVar) == "from-the-environment");
  env::set_override(kVar, "set");
  CHECK(env::string(kVar) == "set");
  env::clear_override(kVar);
  CHECK(env::string(kVar) == "from-the-environment");
  ::unsetenv(kVar);
  CHECK_FALSE(env::raw(kVar).has_value());
}

TEST_CASE("env: a forced CPU rule and its variable are one code path", "[common][env][linear]") {
  namespace env = kiln::env;
  using kiln::ops::cpu_cross_entropy_uses_loop;
  using kiln::ops::cpu_linear_uses_fp32_gemm;
  using kiln::ops::cpu_native_low_precision_gemm;
  using kiln::ops::linear_cross_entropy_matmul_dtype;
  namespace testing = kiln::ops::testing;
  for (const int mode : {0, 1}) {
    const std::string flag = mode == 1 ? "1" : "0";
    bool by_variable[4], by_hook[4];
    {
      const env::Override gemm("KILN_CPU_LOW_PRECISION_GEMM", mode == 1 ? "native" : "fp32");
      const env::Override linear("KILN_CPU_LINEAR_FP32", flag);
      const env::Override head("KILN_CPU_HEAD_FP32", flag);
      const env::Override loop("KILN_CPU_CE_LOOP", flag);
      by_variable[0] = cpu_native_low_precision_gemm(at::kBFloat16);
      by_variable[1] = cpu_linear_uses_fp32_gemm(at::kBFloat16);
      by_variable[2] = linear_cross_entropy_matmul_dtype(at::kBFloat16, /*cpu=*/true) == at::kFloat;
      by_variable[3] = cpu_cross_entropy_uses_loop(at::kBFloat16);
    }
    testing::force_cpu_native_low_precision_gemm(mode);
    testing::force_cpu_linear_fp32(mode);
    testing::force_cpu_head_fp32(mode);
    testing::force_cpu_cross_entropy_aten(mode == 0);
    by_hook[0] = cpu_native_low_precision_gemm(at::kBFloat16);
    by_hook[1] = cpu_linear_uses_fp32_gemm(at::kBFloat16);
    by_hook[2] = linear_cross_entropy_matmul_dtype(at::kBFloat16, /*cpu=*/true) == at::kFloat;
    by_hook[3] = cpu_cross_entropy_uses_loop(at::kBFloat16);
    CHECK(env::string("KILN_CPU_LOW_PRECISION_GEMM") == (mode == 1 ? "native" : "fp32"));  // the hook's override
    testing::force_cpu_native_low_precision_gemm(-1);
    testing::force_cpu_linear_fp32(-1);
    testing::force_cpu_head_fp32(-1);
    testing::force_cpu_cross_entropy_aten(false);
    for (int i = 0; i < 4; ++i) CHECK(by_variable[i] == by_hook[i]);
    CHECK(by_hook[0] == (mode == 1));
    CHECK(by_hook[1] == (mode == 1));
    CHECK(by_hook[2] == (mode == 1));
    CHECK(by_hook[3] == (mode == 1));
  }
}

TEST_CASE("dtype names: one table, both ways", "[common][dtype]") {
  for (const auto& [name, type] : {std::pair{"fp32", at::kFloat}, std::pair{"bf16", at::kBFloat16},
                                   std::pair{"fp16", at::kHalf}, std::pair{"fp64", at::kDouble}}) {
    CHECK(kiln::dtype_from_name(name) == type);
    CHECK(kiln::dtype_name(type) == name);
  }
  CHECK(kiln::autocast_dtype("bf16") == at::kBFloat16);
  CHECK(kiln::autocast_dtype("fp16") == at::kHalf);
  CHECK_FALSE(kiln::autocast_dtype("fp32").has_value());
  CHECK(kiln::test::error_of<std::invalid_argument>([] { kiln::dtype_from_name("int8"); }) ==
        "dtype 'int8' is not fp32, bf16, fp16 or fp64");
  CHECK_THAT(kiln::test::error_of<std::invalid_argument>([] { kiln::dtype_name(at::kInt); }), Contains("no kiln name"));
}
