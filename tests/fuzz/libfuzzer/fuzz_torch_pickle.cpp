// libFuzzer harness: the pickle of a torch.save file (data.pkl), wrapped each time in a valid
// archive with two storage records, so that the mutations reach the pre-scan and LibTorch's
// unpickler instead of the zip reader. The contract is fuzz_pt_file.cpp's.
#include <cstdint>
#include <string>
#include <vector>

#include <caffe2/serialize/inline_container.h>

#include "harness.h"
#include "kiln/io/input_file.h"
#include "kiln/io/torch_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string archive;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) -> size_t {
      archive.append(static_cast<const char*>(p), n);
      return n;
    });
    writer.writeRecord("data.pkl", data, size);
    // The storages the seeds name ("0": 32 fp32 or 16 fp64, "1": 4 fp32), and one odd size.
    const std::vector<char> zeros(128, 0);
    writer.writeRecord("data/0", zeros.data(), 128);
    writer.writeRecord("data/1", zeros.data(), 16);
    writer.writeRecord("data/2", zeros.data(), 3);
    writer.writeEndOfFile();
  }
  const kiln::fuzz::InputFile file(reinterpret_cast<const uint8_t*>(archive.data()), archive.size());
  try {
    kiln::fuzz::touch_all(kiln::io::load_torch_pickle(file.path()));
    kiln::fuzz::loaded();
  } catch (const kiln::io::InputError&) {
    kiln::fuzz::refused();
  }
  return 0;
}
