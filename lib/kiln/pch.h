// Precompiled for every kiln target (CMake KILN_PCH): the LibTorch headers that most kiln
// translation units include, parsed once per build instead of once per file.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
