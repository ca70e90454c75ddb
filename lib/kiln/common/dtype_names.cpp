#include "kiln/common/dtype_names.h"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>

namespace kiln {

namespace {
constexpr std::array<std::pair<std::string_view, c10::ScalarType>, 4> kDtypes{{
    {"fp32", c10::ScalarType::Float},
    {"bf16", c10::ScalarType::BFloat16},
    {"fp16", c10::ScalarType::Half},
    {"fp64", c10::ScalarType::Double},
}};
}  // namespace

c10::ScalarType dtype_from_name(std::string_view name) {
  for (const auto& [n, type] : kDtypes) {
    if (n == name) return type;
  }
  throw std::invalid_argument("dtype '" + std::string(name) + "' is not fp32, bf16, fp16 or fp64");
}

std::string_view dtype_name(c10::ScalarType type) {
  for (const auto& [n, t] : kDtypes) {
    if (t == type) return n;
  }
  throw std::invalid_argument(std::string("dtype ") + c10::toString(type) +
                              " has no kiln name (fp32, bf16, fp16, fp64)");
}

std::optional<c10::ScalarType> autocast_dtype(std::string_view compute) {
  const c10::ScalarType type = dtype_from_name(compute);
  if (type == c10::ScalarType::BFloat16 || type == c10::ScalarType::Half) return type;
  return std::nullopt;
}

}  // namespace kiln
