// libFuzzer harness: a whole torch.save file (.pt: the zip archive, its pickle and its records),
// read as a resume reads transformers' optimizer.pt, scheduler.pt and scaler.pt. Contract: it
// loads, or io::InputError names the file; no crash, no read outside what the archive gave
// (AddressSanitizer, through touch_all), no leak (LeakSanitizer at exit), no hang (-timeout).
#include <cstdint>

#include "harness.h"
#include "kiln/io/input_file.h"
#include "kiln/io/torch_pickle.h"
#include "kiln/train/hf/hf_optimizer_files.h"

namespace {

// The parameter shapes of the seeds' model (scripts/fuzz_seeds.py: two weights, one norm).
const std::vector<kiln::train::HfParamShape>& shapes() {
  static const std::vector<kiln::train::HfParamShape> s = {
      {"embed.weight", true, {8, 4}}, {"proj.weight", true, {4, 4}}, {"norm.weight", false, {4}}};
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kiln::fuzz::InputFile file(data, size);
  try {
    const c10::IValue v = kiln::io::load_torch_pickle(file.path());
    kiln::fuzz::touch_all(v);
    kiln::fuzz::loaded();
    // What a resume does with it next: each reader refuses or accepts, never crashes.
    try {
      kiln::train::read_hf_adamw(v, shapes(), file.path());
    } catch (const kiln::io::InputError&) {
    }
    try {
      kiln::train::read_hf_lambda_lr(v, file.path());
    } catch (const kiln::io::InputError&) {
    }
    try {
      kiln::train::read_hf_grad_scaler(v, file.path());
    } catch (const kiln::io::InputError&) {
    }
  } catch (const kiln::io::InputError&) {
    kiln::fuzz::refused();
  }
  return 0;
}
