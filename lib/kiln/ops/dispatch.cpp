#include "kiln/ops/dispatch.h"

#include <atomic>
#include <stdexcept>

namespace kiln::ops {
namespace {
std::atomic<Backend> g_backend{Backend::kKiln};
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
