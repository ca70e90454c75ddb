#include "kiln/io/torch_pickle.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "kiln/io/safetensors.h"

namespace kiln::io {

namespace {

// CPU, contiguous copies of every tensor in `v` (the pickler writes a tensor's whole storage: a
// view of a larger buffer would carry the rest of it along).
c10::IValue to_cpu(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().detach().to(at::kCPU).contiguous().clone();
  if (v.isGenericDict()) {
    const auto in = v.toGenericDict();
    c10::Dict<c10::IValue, c10::IValue> out(in.keyType(), in.valueType());
    for (const auto& e : in) out.insert(e.key(), to_cpu(e.value()));
    return out;
  }
  if (v.isList()) {
    const auto in = v.toList();
    c10::List<c10::IValue> out(c10::AnyType::get());  // typed lists pickle through torch.jit helpers
    for (const c10::IValue& e : in) out.push_back(to_cpu(e));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& e : v.toTupleRef().elements()) items.push_back(to_cpu(e));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return v;
}

}  // namespace

void save_torch_pickle(const std::string& path, const c10::IValue& value) {
  const c10::IValue cpu = to_cpu(value);
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(cpu);
  pickler.stop();
  write_stream_atomic(path, [&](const std::function<void(const void*, size_t)>& put) {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
      put(data, n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  });
}

c10::IValue load_torch_pickle(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                             /*type_resolver=*/std::nullopt, /*obj_loader=*/std::nullopt,
                                             at::Device(at::kCPU), reader);
  } catch (const c10::Error& e) {
    throw std::runtime_error(
        fmt::format("{}: not a torch.save file LibTorch can read ({})", path, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: not a torch.save file LibTorch can read ({})", path, e.what()));
  }
}

namespace torch_pickle {

c10::IValue list(const std::vector<c10::IValue>& items) {
  c10::List<c10::IValue> out(c10::AnyType::get());
  for (const auto& v : items) out.push_back(v);
  return out;
}

c10::IValue dict(const std::vector<std::pair<std::string, c10::IValue>>& items) {
  c10::Dict<c10::IValue, c10::IValue> out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [k, v] : items) out.insert(k, v);
  return out;
}

}  // namespace torch_pickle

}  // namespace kiln::io
