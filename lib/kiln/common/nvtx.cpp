// NVTX ranges (nvtx.h): NVTX v3's header-only API where the build found it (KILN_WITH_NVTX).
#include "kiln/common/nvtx.h"

#ifdef KILN_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace kiln::nvtx {

#ifdef KILN_WITH_NVTX
bool compiled_in() {
  return true;
}
void push(const char* name) {
  nvtxRangePushA(name);
}
void pop() {
  nvtxRangePop();
}
#else
bool compiled_in() {
  return false;
}
void push(const char*) {}
void pop() {}
#endif

}  // namespace kiln::nvtx
