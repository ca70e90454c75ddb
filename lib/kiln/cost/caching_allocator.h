// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, its default
// settings) at the granularity of a step's tensors: what nvidia-smi shows is the allocator's
// reserved segments (plus the CUDA context), which exceed the live bytes by the free blocks that
// the later requests could not use. cost/reference.cpp replays the reference stack's step through
// it (reference_memory). The rules, as the allocator applies them:
//   - every request is rounded up to 512 bytes;
//   - requests up to 1 MiB come from the small pool's 2 MiB segments, larger ones from the large
//     pool;
//   - a request takes the smallest cached free block of its pool that holds it (best fit); a larger
//     block is split when the rest would exceed 1 MiB (large pool) or is at least 512 bytes (small);
//   - without such a block a new segment is reserved (cudaMalloc): 2 MiB for the small pool, 20 MiB
//     for a request under 10 MiB, else the request rounded up to 2 MiB;
//   - a freed block merges with its free neighbours in the same segment; segments are never
//     returned (no empty_cache in a training loop).
// One stream, no expandable segments, no max_split_size (the defaults).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace kiln::cost {

class CachingAllocatorModel {
 public:
  // Returns a handle for free().
  int64_t allocate(double bytes);
  void free(int64_t handle);

  double allocated() const { return allocated_; }  // live (rounded) bytes
  double reserved() const { return reserved_; }    // segments
  double peak_allocated() const { return peak_allocated_; }
  double peak_reserved() const { return reserved_; }  // never falls

  static double round_size(double bytes);

 private:
  struct Block {
    int64_t segment = 0;
    double offset = 0, size = 0;
    bool free = true;
    bool small = false;
  };
  std::map<int64_t, Block> blocks_;  // by handle
  int64_t next_ = 1, next_segment_ = 1;
  double allocated_ = 0, reserved_ = 0, peak_allocated_ = 0;
};

}  // namespace kiln::cost
