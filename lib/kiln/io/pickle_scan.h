// A pre-scan of a torch.save file's pickle (data.pkl) before LibTorch's unpickler sees it
// (docs/formats.md, "Hostile files").
//
// LibTorch's unpickler trusts its input: a memo index sizes its memo table (LONG_BINPUT 0x12000000
// allocates 5 GB), a string's declared length is allocated before it is read, a MARK below popped
// items is indexed unchecked, nesting has no limit (a million nested lists overflow the stack in the
// destructor), a list may contain itself (never freed), and any int may name a global to call. The
// scan runs the same stack machine over placeholder values, with limits, and refuses before
// anything is allocated from the file's word:
//   - protocol 2, and only the opcodes of a state dict as Python's torch.save and LibTorch's
//     pickler write them (containers, numbers, strings, memo, tensors); no BUILD, NEWOBJ, INST,
//     or protocol 3-5 opcodes;
//   - globals only torch._utils._rebuild_tensor_v2, collections.OrderedDict and the storage
//     classes of plain dtypes (no sparse, quantized or subclassed tensors, no devices, no
//     complex numbers, no TorchScript helpers);
//   - every length within the bytes left, every memo index at most the number of memo entries
//     so far, no pop below a MARK, dict keys of str/int/float/bool/None, an even count of keys
//     and values;
//   - the object graph acyclic, at most max_depth deep, at most max_nodes values, max_containers
//     containers and max_tensors tensors;
//   - every storage a tensor names is a record "data/<key>" of the archive whose bytes hold the
//     storage's declared elements, at location "cpu" or "cuda[:N]".
// What it cannot see (a tensor's view within its storage) is checked on the tensors LibTorch
// builds (io/torch_pickle.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln::io {

struct PickleLimits {
  size_t max_nodes = size_t{8} << 20;  // values of any kind, memo entries and stack items included
  size_t max_containers = size_t{1} << 20;
  size_t max_tensors = size_t{1} << 17;  // a 70B model's AdamW state holds ~2,000
  int max_depth = 32;                    // optimizer.pt nests 5 deep
};

struct PickleScan {
  std::vector<std::string> storage_keys;  // the records "data/<key>" tensors name, each once
  size_t nodes = 0, containers = 0, tensors = 0;
  int depth = 0;
};

// `record_bytes(key)`: the size of the archive's record "data/<key>", or nullopt without one.
// Throws InputError naming `file`, "data.pkl" and the byte offset of the refused opcode.
PickleScan scan_torch_pickle(const uint8_t* data, size_t size,
                             const std::function<std::optional<uint64_t>(const std::string&)>& record_bytes,
                             const std::string& file, const PickleLimits& limits = {});

}  // namespace kiln::io
