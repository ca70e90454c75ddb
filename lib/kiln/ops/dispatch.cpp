#include "kiln/ops/dispatch.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

namespace kiln::ops {
namespace {
std::atomic<Backend> g_backend{Backend::kKiln};
std::atomic<bool> g_flash{[] {
  const char* env = std::getenv("KILN_FLASH_ATTENTION");
  return env != nullptr && std::string(env) == "1";
}()};
}  // namespace

void set_flash_attention(bool enabled) {
  g_flash.store(enabled);
}
bool flash_attention_enabled() {
  return g_flash.load();
}

void set_backend(Backend b) {
  g_backend.store(b);
}
Backend backend() {
  return g_backend.load();
}

std::string backend_name(Backend b) {
  return b == Backend::kKiln ? "kiln" : "aten";
}

Backend parse_backend(const std::string& name) {
  if (name == "kiln") return Backend::kKiln;
  if (name == "aten") return Backend::kAten;
  throw std::invalid_argument("kernel backend must be 'kiln' or 'aten', got '" + name + "'");
}

bool kernels_compiled() {
#ifdef KILN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace kiln::ops
