// Catch2's own main for kiln_counters_off_tests (tests/CMakeLists.txt): the OFF build's counters
// source and its test, linked with LibTorch alone.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
