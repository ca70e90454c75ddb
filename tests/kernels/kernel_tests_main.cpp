// Catch2's main for kiln_kernel_tests (tests/kernels/test_kernels_strict.cpp), the LibTorch-free
// runs of the CUDA kernels through the emulation.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
