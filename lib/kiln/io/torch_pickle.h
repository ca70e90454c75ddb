// torch.save files (.pt): the zip archive of a pickle and its tensors' storages, as Python's
// torch.save and LibTorch's torch::pickle_save write it, through LibTorch's own pickler and
// unpickler (docs/formats.md, "torch.save files").
//
// Written without the JIT's type tags (torch::jit::Pickler with tag_aggregates = false): a plain
// torch::pickle_save file is refused by torch.load(weights_only=True), the only way transformers'
// Trainer reads optimizer.pt and scheduler.pt, because the tags are GLOBALs outside its allow
// list. So what goes in are dicts, generic lists and tuples of None, bools, ints, doubles, strings
// and CPU tensors; typed lists (c10::List<double>...) are pickled through torch.jit helpers that a
// weights-only load refuses too, so callers build generic ones (torch_pickle::list).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

namespace kiln::io {

// Writes `value` to `path` through a temporary file and rename; tensors are saved from CPU copies.
void save_torch_pickle(const std::string& path, const c10::IValue& value);

// Reads a torch.save file with every tensor on the CPU, whatever device it was saved from. The
// file may be hostile (a checkpoint someone shared): it is read as io/input_file.h reads files
// (a regular file, never a blocking open), its zip directory is checked before LibTorch's reader
// opens it (stored records within the file), its pickle is pre-scanned (io/pickle_scan.h) before
// LibTorch's unpickler runs, each storage is its record whole, and every tensor is checked to
// lie within its storage. Throws io::InputError ("<path>: <field>: expected ..., found ...")
// for anything else, before any value of the file is used.
c10::IValue load_torch_pickle(const std::string& path);

namespace torch_pickle {
// A generic list (pickled as a plain Python list, which a weights-only load accepts).
c10::IValue list(const std::vector<c10::IValue>& items);
// A dict with string keys, in the given order.
c10::IValue dict(const std::vector<std::pair<std::string, c10::IValue>>& items);
}  // namespace torch_pickle

}  // namespace kiln::io
