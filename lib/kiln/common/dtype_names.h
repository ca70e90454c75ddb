// kiln's names of the floating-point dtypes, as the config keys, the programs' --dtype flags and
// the reports spell them: fp32, bf16, fp16 and fp64, each the name of one c10::ScalarType. The one
// table of the repository: every name -> ScalarType (and back) goes through it. Which names a
// setting accepts is the setting's own check (a compute dtype is fp32, bf16 or fp16; kiln-hf's
// --dtype takes fp64 too); these functions take any of the four.
#pragma once

#include <optional>
#include <string_view>

#include <c10/core/ScalarType.h>

namespace kiln {

// The ScalarType named `name` ("fp32" -> kFloat, "bf16" -> kBFloat16, "fp16" -> kHalf, "fp64" ->
// kDouble). Throws std::invalid_argument for another word ("dtype 'int8' is not fp32, bf16, fp16
// or fp64").
c10::ScalarType dtype_from_name(std::string_view name);

// The name of `type` ("fp32", "bf16", "fp16", "fp64"); throws std::invalid_argument for another
// ScalarType.
std::string_view dtype_name(c10::ScalarType type);

// The autocast dtype of a compute dtype: bf16 and fp16 run under autocast in that dtype, fp32 (and
// fp64) without (nullopt). Throws as dtype_from_name for another word.
std::optional<c10::ScalarType> autocast_dtype(std::string_view compute);

}  // namespace kiln
