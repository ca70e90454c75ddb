// libFuzzer harness: the JSON state files of a checkpoint, trainer_state.json (HF's
// TrainerState) and kiln_state.json, each read from the same bytes. Contract: it loads with every
// number in range, or io::InputError names the file; no crash, no stack overflow on deep nesting,
// no leak, no hang.
#include <cstdint>

#include "harness.h"
#include "kiln/io/input_file.h"
#include "kiln/train/checkpoint_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kiln::fuzz::InputFile file(data, size);
  try {
    const kiln::train::TrainerStateFile s = kiln::train::read_trainer_state_file(file.path());
    if (s.global_step < 0 || s.total_flos < 0 || !s.log_history.is_array()) __builtin_trap();
    (void)s.log_history.dump();  // what a checkpoint save writes back
    kiln::fuzz::loaded();
  } catch (const kiln::io::InputError&) {
    kiln::fuzz::refused();
  }
  try {
    const kiln::train::KilnStateFile k = kiln::train::read_kiln_state_file(file.path());
    if (k.world_size < 1 || k.zero_stage < 0 || k.zero_stage > 2) __builtin_trap();
  } catch (const kiln::io::InputError&) {
  }
  return 0;
}
