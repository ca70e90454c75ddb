// The counting allocator is a process-lifetime singleton: a tensor allocated through it may
// outlive the guard (and its deleter then still has to find the counter), so it is never
// destroyed.
//
// Every DataPtr it returns has its data pointer as its context and one fixed deleter, as c10's
// raw interface requires (Allocator::raw_allocate asserts data == context and releases the
// context; raw_deallocate calls raw_deleter() on the bare pointer). oneDNN's bf16 kernels on
// AVX-512 machines allocate their scratch through that raw interface, so a DataPtr with a
// separate context (as this allocator once returned) fails there with an internal assert. The
// delegate's own DataPtr (whatever its context) is kept in a table keyed by the data pointer,
// together with the size, and the deleter looks it up, subtracts the size and frees through it.
#include "kiln/profile/counters/cpu_allocator.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace kiln::profile {

namespace {

// Above the default registration priority, so SetCPUAllocator accepts both the install and the
// restore.
constexpr uint8_t kPriority = 200;

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const auto bytes = static_cast<int64_t>(n);
    const int64_t cap = cap_.load();
    const int64_t now = current_.fetch_add(bytes) + bytes;
    if (cap > 0 && now > cap) {
      current_.fetch_sub(bytes);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU allocation of ", n, " bytes exceeds the memory cap of ", cap,
                       " bytes (", now - bytes, " bytes in use)");
    }
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    c10::DataPtr inner;
    try {
      inner = delegate_->allocate(n);
    } catch (...) {
      current_.fetch_sub(bytes);
      throw;
    }
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) {  // a zero-byte allocation: nothing to track (free_raw ignores null)
      current_.fetch_sub(bytes);
      return {nullptr, nullptr, &CountingAllocator::free_raw, device};
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(data, Live{std::move(inner), n});
    }
    return {data, data, &CountingAllocator::free_raw, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::free_raw; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  // The deleter of every DataPtr above: `p` is the data pointer (= the context).
  static void free_raw(void* p);

  struct Live {
    c10::DataPtr inner;  // the delegate's allocation; freed through its own deleter
    size_t bytes;
  };
  c10::Allocator* delegate_ = nullptr;
  std::atomic<int64_t> current_{0}, peak_{0}, cap_{0};
  std::atomic<bool> installed_{false};
  std::mutex mutex_;
  std::unordered_map<void*, Live> live_;
};

CountingAllocator& instance() {
  static auto* a = new CountingAllocator();  // never destroyed: see the note at the top
  return *a;
}

void CountingAllocator::free_raw(void* p) {
  if (p == nullptr) return;
  CountingAllocator& a = instance();
  c10::DataPtr inner;
  {
    std::lock_guard<std::mutex> lock(a.mutex_);
    const auto it = a.live_.find(p);
    // Only pointers this allocator returned reach here; anything else is a caller's bug that
    // must not corrupt the counts or free foreign memory.
    TORCH_INTERNAL_ASSERT(it != a.live_.end(), "counting CPU allocator: free of a pointer it did not allocate");
    inner = std::move(it->second.inner);
    a.current_.fetch_sub(static_cast<int64_t>(it->second.bytes));
    a.live_.erase(it);
  }
  // `inner` goes out of scope here, outside the lock: the delegate frees the memory.
}

}  // namespace

CountingCpuAllocatorGuard::CountingCpuAllocatorGuard(int64_t cap_bytes) {
  CountingAllocator& a = instance();
  if (a.installed_.exchange(true)) throw std::logic_error("CountingCpuAllocatorGuard: one is already installed");
  a.delegate_ = c10::GetCPUAllocator();
  a.cap_ = cap_bytes;
  a.peak_ = a.current_.load();
  c10::SetCPUAllocator(&a, kPriority);
}

CountingCpuAllocatorGuard::~CountingCpuAllocatorGuard() {
  CountingAllocator& a = instance();
  a.cap_ = 0;
  c10::SetCPUAllocator(a.delegate_, kPriority);
  a.installed_ = false;
}

CpuMemoryStats CountingCpuAllocatorGuard::stats() const {
  const CountingAllocator& a = instance();
  return {a.current_.load(), a.peak_.load()};
}

void CountingCpuAllocatorGuard::reset_peak() {
  CountingAllocator& a = instance();
  a.peak_ = a.current_.load();
}

void CountingCpuAllocatorGuard::set_cap(int64_t cap_bytes) {
  instance().cap_ = cap_bytes;
}

c10::Allocator* CountingCpuAllocatorGuard::allocator() {
  return &instance();
}

}  // namespace kiln::profile
