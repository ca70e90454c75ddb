// The library's log: one spdlog logger named "kiln" (docs/embedding.md). kiln never writes to
// stdout and never prints to stderr except through it.
//
// By default the logger writes the bare message to stderr (the kiln-* programs' output). A host
// process replaces or silences it either through spdlog's registry (spdlog::drop("kiln") and
// register its own logger of that name, or spdlog::get("kiln")->set_level(spdlog::level::off)),
// or, without spdlog in its own code, with set_log_handler (kiln/common/log.h).
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

namespace kiln {

// The "kiln" logger from spdlog's registry, created on first use if the host registered none.
std::shared_ptr<spdlog::logger> logger();

}  // namespace kiln
