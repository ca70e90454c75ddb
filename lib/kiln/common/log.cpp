#include "kiln/common/logger.h"

#include <mutex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "kiln/common/log.h"

namespace kiln {

namespace {

constexpr const char* kName = "kiln";
std::mutex g_mutex;  // creating / replacing the logger

// Forwards each record to the host's handler.
class HandlerSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit HandlerSink(LogHandler handler) : handler_(std::move(handler)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const LogLevel level = msg.level >= spdlog::level::err    ? LogLevel::kError
                           : msg.level == spdlog::level::warn ? LogLevel::kWarning
                           : msg.level == spdlog::level::info ? LogLevel::kInfo
                                                              : LogLevel::kDebug;
    handler_(level, std::string_view(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override {}

 private:
  LogHandler handler_;
};

std::shared_ptr<spdlog::logger> make_default() {
  auto l = std::make_shared<spdlog::logger>(kName, std::make_shared<spdlog::sinks::stderr_sink_mt>());
  l->set_pattern("%v");
  l->set_level(spdlog::level::info);
  l->flush_on(spdlog::level::info);
  return l;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger() {
  if (auto l = spdlog::get(kName)) return l;
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (auto l = spdlog::get(kName)) return l;
  auto l = make_default();
  spdlog::register_logger(l);
  return l;
}

void set_log_handler(LogHandler handler) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  // The destination changes, the level stays (set_log_level is the other, independent knob).
  const auto previous = spdlog::get(kName);
  const spdlog::level::level_enum level = previous ? previous->level() : spdlog::level::info;
  spdlog::drop(kName);
  std::shared_ptr<spdlog::logger> l;
  if (handler) {
    l = std::make_shared<spdlog::logger>(kName, std::make_shared<HandlerSink>(std::move(handler)));
    l->set_pattern("%v");
  } else {
    l = make_default();
  }
  l->set_level(level);
  spdlog::register_logger(l);
}

void set_log_level(LogLevel level) {
  auto l = logger();
  switch (level) {
    case LogLevel::kDebug:
      l->set_level(spdlog::level::debug);
      break;
    case LogLevel::kInfo:
      l->set_level(spdlog::level::info);
      break;
    case LogLevel::kWarning:
      l->set_level(spdlog::level::warn);
      break;
    case LogLevel::kError:
      l->set_level(spdlog::level::err);
      break;
    case LogLevel::kOff:
      l->set_level(spdlog::level::off);
      break;
  }
}

}  // namespace kiln
