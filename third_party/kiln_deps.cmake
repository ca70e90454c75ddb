# Finds kiln's C++ dependencies (Debian packages on the reference machine: see scripts/setup.sh).
# A system that lacks one gets a pinned release through FetchContent when KILN_FETCH_MISSING is on.
# Every dependency ends up as one target name used in the rest of the build:
#   fmt::fmt  spdlog::spdlog  yaml-cpp  nlohmann_json::nlohmann_json
#   kiln::pcre2  Catch2::Catch2 (tests)  benchmark::benchmark (apps)
include(FetchContent)

# kiln_fetch(<name> <git url> <tag>): the pinned fallback, or a clear error when fetching is off.
macro(kiln_fetch name url tag)
  if(NOT KILN_FETCH_MISSING)
    message(FATAL_ERROR "kiln: ${name} not found; install it (scripts/setup.sh) or set KILN_FETCH_MISSING=ON")
  endif()
  message(STATUS "kiln: ${name} not found on the system, fetching ${tag}")
  FetchContent_Declare(${name} GIT_REPOSITORY ${url} GIT_TAG ${tag} GIT_SHALLOW TRUE)
  FetchContent_MakeAvailable(${name})
endmacro()

find_package(fmt QUIET)
if(NOT fmt_FOUND)
  kiln_fetch(fmt https://github.com/fmtlib/fmt.git 9.1.0)
endif()

# LibTorch's include folder carries its own copy of fmt's headers (a newer major version than the
# fmt we link). Both are -isystem folders and LibTorch's would win, compiling calls against a
# library we do not link. A folder holding only a link to the linked fmt's headers, placed before
# LibTorch's, makes every kiln target see the fmt it links (spdlog's too).
if(DEFINED fmt_SOURCE_DIR)
  set(_kiln_fmt_include "${fmt_SOURCE_DIR}/include")
else()
  get_target_property(_kiln_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  list(GET _kiln_fmt_include 0 _kiln_fmt_include)
endif()
set(_kiln_fmt_shadow "${PROJECT_BINARY_DIR}/kiln_fmt_include")
file(MAKE_DIRECTORY "${_kiln_fmt_shadow}")
file(CREATE_LINK "${_kiln_fmt_include}/fmt" "${_kiln_fmt_shadow}/fmt" SYMBOLIC)
target_include_directories(kiln_torch SYSTEM BEFORE INTERFACE "${_kiln_fmt_shadow}")

find_package(spdlog QUIET)
if(NOT spdlog_FOUND)
  set(SPDLOG_FMT_EXTERNAL ON)
  kiln_fetch(spdlog https://github.com/gabime/spdlog.git v1.10.0)
endif()

find_package(yaml-cpp QUIET)
if(NOT yaml-cpp_FOUND)
  set(YAML_CPP_BUILD_TESTS OFF)
  set(YAML_CPP_BUILD_TOOLS OFF)
  kiln_fetch(yaml-cpp https://github.com/jbeder/yaml-cpp.git yaml-cpp-0.7.0)
endif()
if(NOT TARGET yaml-cpp AND TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp ALIAS yaml-cpp::yaml-cpp)
endif()

find_package(nlohmann_json 3.10 QUIET)
if(NOT nlohmann_json_FOUND)
  set(JSON_BuildTests OFF)
  kiln_fetch(nlohmann_json https://github.com/nlohmann/json.git v3.11.2)
endif()

# PCRE2 (8-bit, with JIT) ships a pkg-config file rather than a CMake package.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(KILN_PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
endif()
add_library(kiln_pcre2 INTERFACE)
add_library(kiln::pcre2 ALIAS kiln_pcre2)
target_compile_definitions(kiln_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
if(KILN_PCRE2_FOUND)
  target_link_libraries(kiln_pcre2 INTERFACE PkgConfig::KILN_PCRE2)
else()
  set(PCRE2_BUILD_TESTS OFF)
  set(PCRE2_SUPPORT_JIT ON)
  kiln_fetch(pcre2 https://github.com/PCRE2Project/pcre2.git pcre2-10.42)
  target_link_libraries(kiln_pcre2 INTERFACE pcre2-8-static)
endif()

# Cairo draws plot_loss's figures (kiln/train/hf/loss_plot.cpp); Debian libcairo2-dev, found by
# pkg-config. Optional: without it kiln builds and plot_loss: true warns that there is no figure.
if(PkgConfig_FOUND)
  pkg_check_modules(KILN_CAIRO QUIET IMPORTED_TARGET cairo)
endif()
add_library(kiln_cairo INTERFACE)
add_library(kiln::cairo ALIAS kiln_cairo)
if(KILN_CAIRO_FOUND)
  set(KILN_WITH_CAIRO ON)
  target_link_libraries(kiln_cairo INTERFACE PkgConfig::KILN_CAIRO)
else()
  set(KILN_WITH_CAIRO OFF)
  message(STATUS "kiln: cairo not found (Debian: libcairo2-dev): plot_loss will draw no figures")
endif()

if(KILN_BUILD_TESTS)
  find_package(Catch2 2.13 QUIET)
  if(NOT Catch2_FOUND)
    kiln_fetch(Catch2 https://github.com/catchorg/Catch2.git v2.13.10)
  endif()
endif()

if(KILN_BUILD_APPS)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    set(BENCHMARK_ENABLE_TESTING OFF)
    kiln_fetch(benchmark https://github.com/google/benchmark.git v1.7.1)
  endif()
endif()

# Gloo's headers, for c10d's Gloo process group (kiln/dist/comm.cpp). The torch wheel ships the
# library inside libtorch_cpu and the c10d headers, but not gloo's own headers; Debian's
# libgloo-dev provides them (header-only use: nothing of it is linked). Gloo has no releases to
# pin a fetched copy to, and a copy that differs from the one inside the wheel would be an ABI
# hazard, so without the headers kiln builds without data parallelism (KILN_WITH_DIST OFF) and
# says so; a launcher's environment is then refused with a clear message (kiln/dist/comm.h).
find_path(KILN_GLOO_INCLUDE_DIR gloo/config.h)
if(KILN_GLOO_INCLUDE_DIR)
  set(KILN_WITH_DIST ON)
else()
  set(KILN_WITH_DIST OFF)
  message(STATUS "kiln: gloo headers not found (Debian: libgloo-dev): building without data parallelism")
endif()
