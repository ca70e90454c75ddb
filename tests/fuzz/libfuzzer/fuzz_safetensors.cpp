// libFuzzer harness: a safetensors file (model.safetensors, optimizer.safetensors,
// rng_state.safetensors of a checkpoint). Contract: it opens and every tensor reads inside the
// file, or SafetensorsError names the file; no crash, no read outside it, no leak, no hang.
#include <cstdint>

#include "harness.h"
#include "kiln/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kiln::fuzz::InputFile file(data, size);
  try {
    const kiln::io::SafetensorsFile f(file.path());
    for (const std::string& name : f.names()) kiln::fuzz::touch(f.tensor(name));
    kiln::fuzz::loaded();
  } catch (const kiln::io::SafetensorsError&) {
    kiln::fuzz::refused();
  }
  return 0;
}
