// Small helpers shared by the tests.
#pragma once

#include <string>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

namespace kiln::test {

// Largest absolute difference, in fp64.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble).cpu() - b.to(at::kDouble).cpu()).abs().max().item<double>();
}

// Runs `fn` and returns the message of the exception it throws ("" when it throws nothing).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln::test
