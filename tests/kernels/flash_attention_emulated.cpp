// kernels/flash_attention.cu compiled as host C++ against the CUDA emulation, so the tests run
// the kernels' own code on the CPU (see kernels/emulation.h for what that does and does not
// check). Its entry points are kiln::kernels::emulated::*, declared in emulated.h.
#include "kiln/kernels/emulation.h"
// The kernel source itself, not a copy.
#include "kiln/kernels/flash_attention.cu"
