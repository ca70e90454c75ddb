// Small helpers shared by the tests.
#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

namespace kiln::test {

// A fresh, empty folder `name` under this test process's scratch root (in the system temp
// folder, named by the process id); the whole root is removed when the program exits.
inline std::filesystem::path scratch_dir(const std::string& name) {
  struct Root {
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("kiln_tests_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Root root;
  const std::filesystem::path dir = root.path / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Largest absolute difference, in fp64.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble).cpu() - b.to(at::kDouble).cpu()).abs().max().item<double>();
}

// Runs `fn` and returns the message of the exception it throws ("" when it throws nothing). With
// `E`, only an `E` is caught: another exception escapes and fails the test.
template <typename E = std::exception, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln::test
