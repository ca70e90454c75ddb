// Helpers shared by the kiln-* programs' command lines (their settings: settings.h).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "kiln/common/device.h"
#include "kiln/config/key_table.h"

namespace kiln::cli {

// An error's one line for stderr: LibTorch's c10::Error without the C++ backtrace its what() appends.
inline std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// argv[from..argc) as strings.
inline std::vector<std::string> arguments(int argc, char** argv, int from = 1) {
  return from < argc ? std::vector<std::string>(argv + from, argv + argc) : std::vector<std::string>();
}

// The key `key`'s device through the one resolver (common/device.h): auto, cpu or cuda; an error
// names the key and where it was given.
inline at::Device device(const kiln::config::KeySources& given, const std::string& name,
                         const std::string& key = "device") {
  try {
    return kiln::device::resolve(name.empty() ? "auto" : name);
  } catch (const std::invalid_argument& e) {
    given.fail(key, e.what());
  }
}

}  // namespace kiln::cli
