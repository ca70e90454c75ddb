// The counting allocator is a process-lifetime singleton: a tensor allocated through it may
// outlive the guard (and its deleter then still has to find the counter), so it is never
// destroyed. Each allocation carries a small context (the delegate's DataPtr and the size) whose
// deleter subtracts the size and frees through the delegate.
#include "kiln/profile/cpu_allocator.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

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
  struct Context {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
  };

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
    auto* ctx = new Context{std::move(inner), n, this};
    return {data, ctx, &CountingAllocator::free_context, device};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static void free_context(void* p) {
    auto* ctx = static_cast<Context*>(p);
    ctx->owner->current_.fetch_sub(static_cast<int64_t>(ctx->bytes));
    delete ctx;  // frees the memory through the delegate's deleter
  }

  c10::Allocator* delegate_ = nullptr;
  std::atomic<int64_t> current_{0}, peak_{0}, cap_{0};
  std::atomic<bool> installed_{false};
};

CountingAllocator& instance() {
  static auto* a = new CountingAllocator();  // never destroyed: see the note at the top
  return *a;
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

}  // namespace kiln::profile
