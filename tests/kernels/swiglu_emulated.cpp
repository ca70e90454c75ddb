// kernels/swiglu.cu compiled as host C++ against the CUDA emulation (see flash_attention_emulated.cpp).
#include "kiln/kernels/emulation.h"
// The kernel source itself, not a copy.
#include "kiln/kernels/swiglu.cu"
