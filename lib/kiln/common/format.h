// Number formatting shared by the programs' human-readable output.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

// 1235814400 -> "1,235,814,400" (HF Trainer's banner style), independent of the C++ locale.
std::string with_commas(int64_t value);

// 1.5e9 bytes -> "1.40 GiB"; binary units as in nvidia-smi and the CUDA allocator stats.
std::string human_bytes(double bytes);

}  // namespace kiln
