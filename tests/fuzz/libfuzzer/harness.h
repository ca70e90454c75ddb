// Shared parts of the libFuzzer harnesses (tests/fuzz/libfuzzer/CMakeLists.txt): the input as a
// regular file that kiln's readers open by path (a memfd, so that nothing touches the disk), and a
// walk over every element of a tensor through instrumented code, so that AddressSanitizer sees a
// view that reaches outside the bytes a reader gave it (LibTorch's own reads are not instrumented).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace kiln::fuzz {

// How many inputs loaded and how many were refused (an InputError naming the file), printed at
// exit as "kiln-fuzz: <loaded> loaded, <refused> refused" for scripts/fuzz.sh's summary.
struct Outcomes {
  std::atomic<uint64_t> loaded{0}, refused{0};
  static Outcomes& get() {
    static Outcomes* o = [] {
      auto* p = new Outcomes;  // never freed: read by the exit handler
      std::atexit([] {
        std::fprintf(stderr, "kiln-fuzz: %llu loaded, %llu refused\n",
                     static_cast<unsigned long long>(get().loaded.load()),
                     static_cast<unsigned long long>(get().refused.load()));
      });
      return p;
    }();
    return *o;
  }
};
inline void loaded() {
  ++Outcomes::get().loaded;
}
inline void refused() {
  ++Outcomes::get().refused;
}

// The bytes as a regular file at /proc/self/fd/N, closed when this goes.
class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("kiln-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) std::abort();
      done += static_cast<size_t>(w);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Reads every byte of every element of `t` (strided, from its data pointer); returns a checksum so
// that the reads are not optimised away.
inline uint64_t touch(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0;
  const auto* base = static_cast<const volatile uint8_t*>(t.storage().data()) + t.storage_offset() * t.element_size();
  const int64_t dims = t.dim(), item = static_cast<int64_t>(t.element_size());
  std::vector<int64_t> index(static_cast<size_t>(dims), 0);
  uint64_t sum = 0;
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t offset = 0;
    for (int64_t d = 0; d < dims; ++d) offset += index[static_cast<size_t>(d)] * t.stride(d);
    for (int64_t b = 0; b < item; ++b) sum += base[offset * item + b];
    for (int64_t d = dims - 1; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < t.size(d)) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
  return sum;
}

// touch() for every tensor inside a loaded value (containers walked without recursion, shared
// values once).
inline uint64_t touch_all(const c10::IValue& root) {
  uint64_t sum = 0;
  std::vector<c10::IValue> todo{root};
  while (!todo.empty()) {
    const c10::IValue v = todo.back();
    todo.pop_back();
    if (v.isTensor()) {
      sum += touch(v.toTensor());
    } else if (v.isGenericDict()) {
      for (const auto& e : v.toGenericDict()) todo.push_back(e.value());
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) todo.push_back(e);
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) todo.push_back(e);
    }
  }
  return sum;
}

}  // namespace kiln::fuzz
