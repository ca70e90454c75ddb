/* An NVTX tool for the tests (tests/python/test_nvtx.py): loaded by NVTX itself through
 * NVTX_INJECTION64_PATH, the way Nsight Systems attaches, it records every range push and pop of
 * the process, with the thread's id, as lines of the file named by KILN_NVTX_RECORD:
 *   <tid>\tpush\t<name>      <tid>\tpop
 * Only ASCII pushes and pops are hooked (kiln's ranges, common/nvtx.h); NVTX keeps every other
 * call a no-op. */
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <nvtx3/nvToolsExt.h>

namespace {

std::FILE* out = nullptr;
std::mutex lock;

void record(const char* what, const char* name) {
  const std::lock_guard<std::mutex> guard(lock);
  if (!out) return;
  std::fprintf(out, "%ld\t%s%s%s\n", static_cast<long>(syscall(SYS_gettid)), what, name ? "\t" : "", name ? name : "");
  std::fflush(out);
}

int NVTX_API push_a(const char* message) {
  record("push", message);
  return 0;
}

int NVTX_API pop() {
  record("pop", nullptr);
  return 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const char* path = std::getenv("KILN_NVTX_RECORD");
  if (!path || !(out = std::fopen(path, "a"))) return 0;
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) ||
      size <= NVTX_CBID_CORE_RangePop) {
    return 0;
  }
  *table[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(push_a);
  *table[NVTX_CBID_CORE_RangePop] = reinterpret_cast<NvtxFunctionPointer>(pop);
  return 1;
}
