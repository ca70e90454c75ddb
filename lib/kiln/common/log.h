// The log's public controls (installed; kiln/kiln.h includes this): a host process routes kiln's
// records to its own log with set_log_handler, or sets their level. The logger behind them is
// spdlog's "kiln" logger (kiln/common/logger.h, internal; docs/embedding.md).
#pragma once

#include <functional>
#include <string_view>

#include "kiln/export.h"

namespace kiln {

enum class LogLevel { kDebug, kInfo, kWarning, kError, kOff };
using LogHandler = std::function<void(LogLevel level, std::string_view message)>;
// Sends every record of the "kiln" logger to `handler` (from any thread kiln logs on); an empty
// handler restores the default (the bare message on stderr). The level set by set_log_level
// (info by default) stays as it was.
KILN_API void set_log_handler(LogHandler handler);
// Records below `level` are dropped (kOff: all of them).
KILN_API void set_log_level(LogLevel level);

}  // namespace kiln
