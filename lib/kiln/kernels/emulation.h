// A CPU emulation of the CUDA features kiln's kernels use, so that a kernel source (.cu) compiles
// as host C++ and runs thread by thread in the tests of a machine without a GPU. It checks a
// kernel's own index arithmetic, tiling, masking, shared-memory carve-up and synchronisation
// against a reference, and is built to make a kernel that only works by luck fail:
//
// - Threads are cooperative fibers on one OS thread; blocks run one after another. A
//   fiber runs until it reaches a barrier or a warp collective, so what a missing barrier lets
//   happen depends on the order fibers run in: that order is seeded (Config::schedule: index
//   order, reverse, a fresh random permutation per round, or warp-ahead: always the first fiber
//   that can run in a seeded warp priority, so one warp runs on to the next block barrier before
//   any other moves), and the tests run under several seeds.
// - __syncthreads / __syncwarp are generation-counted barriers (memory barriers: under
//   ThreadSanitizer they are its release/acquire points). A block in which every live fiber waits
//   is a deadlock (a divergent barrier) and fails the launch.
// - WMMA load/store/mma are warp collectives that converge the warp but order no memory, as on
//   the hardware: a load reads each lane's share of the tile when that lane arrives (a lane that
//   arrives before another lane wrote its part reads stale data), a store writes each lane's share
//   when that lane leaves (a lane that reads another lane's part before a __syncwarp reads stale
//   data). Which lane holds which element is a seeded map, so code that assumes a layout fails.
//   Every collective checks that all 32 lanes call it with the same pointer and ldm and hold the
//   same fragments; pointers must be 32-byte aligned and ldm a multiple of 16 bytes.
// - ldmatrix and mma.sync.m16n8k16 (sm_80's tensor-core instructions) are warp collectives with
//   the PTX ISA's fragment layouts, not a seeded map: a kernel's own lane arithmetic is what the
//   hardware will run. ldmatrix's row suppliers read as they arrive, like the WMMA loads.
// - cp.async: a copy lands at the cp.async.wait_group that retires it (Landing::kAtWait: a read
//   before the wait sees old bytes) or as soon as it is issued (Landing::kAtIssue: a buffer that
//   other warps still read is overwritten at once when a barrier before the copy is missing).
//   Source and destination must be 16-byte aligned, the destination in the block's shared memory.
// - Shared memory: the dynamic buffer is poison-filled per block with canaries on both sides that
//   are checked when the block ends; static __shared__ arrays (KILN_STATIC_SMEM) are poisoned per
//   block (a kernel that reads what an earlier block left there reads NaN); static plus dynamic
//   bytes are held to the planned architecture's per-block limit (Config::arch), and more than
//   48 KiB of dynamic memory needs cudaFuncSetAttribute first, as on a GPU.
// - Launches check the grid's and the block's limits.
// - Sanitizers: under AddressSanitizer the fiber switches are announced to it; under
//   ThreadSanitizer every fiber is one of its fibers, switches carry no ordering, and only the
//   barriers order memory, so a race that no schedule happens to expose is still reported.
//
// What it cannot check: timing, occupancy, bank conflicts, or what only hardware does.
//
// Use: include this header, then the .cu source, in a translation unit of its own (the macros
// of emulation_runtime.h must not leak into LibTorch's headers). The kernels then live in
// kiln::kernels::emulated (KILN_KERNELS_NS) and KILN_LAUNCH runs them here.
//
// The emulation is split by job into the headers below, which this one includes in order (each
// includes the ones it builds on); include this one, never a part:
//   emulation_fiber.h    fiber context switches, the sanitizers' hooks, Internal
//   emulation_block.h    Config and its environment defaults, the limits, a block's state, the
//                        fiber switches to and from the scheduler
//   emulation_sync.h     barriers, warp shuffles, cp.async, static shared memory
//   emulation_launch.h   the scheduler: a launch's blocks, fibers, poisoning and canaries
//   emulation_wmma.h     the WMMA warp collectives and nvcuda::wmma
//   emulation_mma.h      ldmatrix and mma.sync.m16n8k16 as warp collectives (kernels/mma.cuh)
//   emulation_runtime.h  the CUDA surface the kernels use (macros, intrinsics, runtime calls)
#pragma once

#define KILN_CUDA_EMULATION 1

// In this order: each part builds on the ones before, and the CUDA surface's macros come last.
// clang-format off
#include "kiln/kernels/emulation_fiber.h"
#include "kiln/kernels/emulation_block.h"
#include "kiln/kernels/emulation_sync.h"
#include "kiln/kernels/emulation_launch.h"
#include "kiln/kernels/emulation_wmma.h"
#include "kiln/kernels/emulation_mma.h"
#include "kiln/kernels/emulation_runtime.h"
// clang-format on
