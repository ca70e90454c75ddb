// The one switch between kiln's CUDA kernels and the ATen reference ops.
//
// Every op in kiln::ops has an ATen reference path that runs on any device; where a kiln kernel
// exists and applies (CUDA tensor, supported dtype and shape), the op uses it unless the backend
// is set to kAten. Tests use kAten to get the reference on the same device.
#pragma once

#include <string>

namespace kiln::ops {

enum class Backend { kKiln, kAten };

void set_backend(Backend backend);
Backend backend();
// "kiln" or "aten"; parse_backend throws std::invalid_argument naming the bad value.
std::string backend_name(Backend backend);
Backend parse_backend(const std::string& name);

// kiln's flash-attention kernel inside ops::attention (CUDA, bf16/fp16, head_dim 64/128). Off by
// default until it has been measured against SDPA on a GPU; on with set_flash_attention(true) or
// the environment variable KILN_FLASH_ATTENTION=1. Off, ops::attention uses SDPA.
void set_flash_attention(bool enabled);
bool flash_attention_enabled();

// True when this build compiled the CUDA kernels (KILN_CUDA on).
bool kernels_compiled();

}  // namespace kiln::ops
