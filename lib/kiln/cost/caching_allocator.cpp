#include "kiln/cost/caching_allocator.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kiln::cost {

namespace {

constexpr double kMinBlock = 512;            // kMinBlockSize
constexpr double kSmallSize = 1048576;       // kSmallSize: 1 MiB
constexpr double kSmallBuffer = 2097152;     // kSmallBuffer: 2 MiB
constexpr double kLargeBuffer = 20971520;    // kLargeBuffer: 20 MiB
constexpr double kMinLargeAlloc = 10485760;  // kMinLargeAlloc: 10 MiB
constexpr double kRoundLarge = 2097152;      // kRoundLarge: 2 MiB

double round_up(double x, double to) {
  return std::ceil(x / to) * to;
}

}  // namespace

double CachingAllocatorModel::round_size(double bytes) {
  return bytes < kMinBlock ? kMinBlock : round_up(bytes, kMinBlock);
}

int64_t CachingAllocatorModel::allocate(double bytes) {
  const double size = round_size(bytes);
  const bool small = size <= kSmallSize;
  // Best fit: the smallest free block of the pool that holds the request (the earliest on a tie).
  int64_t best = 0;
  for (const auto& [handle, b] : blocks_) {
    if (b.free && b.small == small && b.size >= size && (best == 0 || b.size < blocks_.at(best).size)) best = handle;
  }
  if (best == 0) {
    const double segment = small ? kSmallBuffer : size < kMinLargeAlloc ? kLargeBuffer : round_up(size, kRoundLarge);
    best = next_++;
    blocks_[best] = Block{next_segment_++, 0, segment, true, small};
    reserved_ += segment;
  }
  Block& b = blocks_.at(best);
  const double rest = b.size - size;
  if (small ? rest >= kMinBlock : rest > kSmallSize) {
    blocks_[next_++] = Block{b.segment, b.offset + size, rest, true, small};
    b.size = size;
  }
  b.free = false;
  allocated_ += b.size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return best;
}

void CachingAllocatorModel::free(int64_t handle) {
  auto it = blocks_.find(handle);
  if (it == blocks_.end() || it->second.free) throw std::logic_error("CachingAllocatorModel: free of a free block");
  Block& b = it->second;
  b.free = true;
  allocated_ -= b.size;
  // Merge with the free neighbours in the same segment.
  for (bool merged = true; merged;) {
    merged = false;
    for (auto n = blocks_.begin(); n != blocks_.end(); ++n) {
      if (n->first == handle || !n->second.free || n->second.segment != b.segment) continue;
      if (n->second.offset + n->second.size == b.offset) {
        b.offset = n->second.offset;
        b.size += n->second.size;
      } else if (b.offset + b.size == n->second.offset) {
        b.size += n->second.size;
      } else {
        continue;
      }
      blocks_.erase(n);
      merged = true;
      break;
    }
  }
}

}  // namespace kiln::cost
