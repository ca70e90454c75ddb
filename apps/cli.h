// Helpers shared by the kiln-* programs' command lines.
#pragma once

#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cxxopts.hpp>

#include "kiln/common/device.h"

namespace kiln::cli {

// An error's one line for stderr: LibTorch's c10::Error without the C++ backtrace its what() appends.
inline std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// options.parse(), with a value that does not parse reported with its option's name: cxxopts
// says only "Argument 'abc' failed to parse"; this says "--steps: cannot parse 'abc'". A word no
// option takes is an error too (cxxopts keeps it aside silently): `--input a.txt b.txt` from a
// shell glob, or `--prompt Once upon a time` unquoted, would otherwise lose all but the first.
inline cxxopts::ParseResult parse(cxxopts::Options& options, int argc, char** argv) {
  try {
    cxxopts::ParseResult result = options.parse(argc, argv);
    if (!result.unmatched().empty()) {
      throw std::invalid_argument("unexpected argument '" + result.unmatched()[0] +
                                  "' (an option takes one value: quote a value with spaces; a list option takes "
                                  "a,b or the option repeated, e.g. --input a.jsonl --input b.jsonl)");
    }
    return result;
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    const std::string what = e.what();
    const auto open = what.find("\u2018"), close = what.find("\u2019");
    const std::string bad = open == std::string::npos || close == std::string::npos
                                ? std::string()
                                : what.substr(open + 3, close - open - 3);
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const auto eq = arg.find('=');
      if (arg.rfind("--", 0) == 0 && eq != std::string::npos && arg.substr(eq + 1) == bad) {
        throw std::invalid_argument(arg.substr(0, eq) + ": cannot parse '" + bad + "'");
      }
      if (i > 1 && arg == bad && std::string(argv[i - 1]).rfind("-", 0) == 0) {
        throw std::invalid_argument(std::string(argv[i - 1]) + ": cannot parse '" + bad + "'");
      }
    }
    throw std::invalid_argument(what);
  }
}

// Throws naming the first of `names` that was not given.
inline void require(const cxxopts::ParseResult& args, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (!args.count(name)) throw std::invalid_argument(std::string("--") + name + " is required");
  }
}

// --device's value through the one resolver (common/device.h): auto, cpu or cuda, "" = auto;
// an error names --device.
inline at::Device device(const std::string& name) {
  try {
    return kiln::device::resolve(name.empty() ? "auto" : name);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--device: ") + e.what());
  }
}

// An optional string option's value, "" when it is absent. (A default_value("") would make
// cxxopts print '(default: "")' after the help text's own default.)
inline std::string optional_string(const cxxopts::ParseResult& args, const std::string& name) {
  return args.count(name) ? args[name].as<std::string>() : std::string();
}

}  // namespace kiln::cli
