// File: caching_allocator.h
// A model of PyTorch's CUDA caching allocator with its default settings
// (c10/cuda/CUDACachingAllocator.cpp, torch 2.11: no max_split_size, no
// expandable segments, no power-of-two rounding): which requests map new
// segments, and so how much memory a sequence of allocations and frees
// leaves reserved. That, not the bytes allocated, is what a GPU runs out of.
//
// The rules, as in DeviceCachingAllocator::malloc and free:
//   * a request is rounded up to 512 B (round_size) and served from the
//     small pool (up to 1 MiB) or the large pool;
//   * it takes the smallest free block of its pool on its stream that fits,
//     the lowest address among equals (BlockComparatorSize, get_free_block);
//   * the block is split, the request taking its front, when what remains
//     is at least 512 B (small pool) or more than 1 MiB (large pool)
//     (should_split);
//   * with no fitting block a segment is mapped: 2 MiB for the small pool,
//     20 MiB for requests under 10 MiB, else the request rounded up to 2 MiB
//     (get_allocation_size);
//   * a freed block merges with free neighbours of its segment
//     (try_merge_blocks); segments never merge, and only ReleaseCached
//     (emptyCache) unmaps them.
// Frees that wait for another stream (record_stream) are the caller's
// business: call Free when the block really comes back.
//
// Example:
//   CachingAllocatorModel m;
//   const auto a = m.Allocate(8 << 20, /*stream=*/0);   // maps a 20 MiB segment
//   m.Free(a.address);
//   m.peak_reserved_bytes();                            // 20 MiB
#ifndef ZPLAN_PLANNER_CACHING_ALLOCATOR_H_
#define ZPLAN_PLANNER_CACHING_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace zplan {

// c10/core/AllocatorConfig.h.
constexpr int64_t kAllocatorMinBlockBytes = 512;            // kMinBlockSize
constexpr int64_t kAllocatorSmallSizeBytes = 1 << 20;       // kSmallSize
constexpr int64_t kAllocatorSmallBufferBytes = 2 << 20;     // kSmallBuffer
constexpr int64_t kAllocatorLargeBufferBytes = 20 << 20;    // kLargeBuffer
constexpr int64_t kAllocatorMinLargeAllocBytes = 10 << 20;  // kMinLargeAlloc
constexpr int64_t kAllocatorRoundLargeBytes = 2 << 20;      // kRoundLarge

class CachingAllocatorModel {
 public:
  struct Allocation {
    int64_t address = 0;
    int64_t block_bytes = 0;     // what the request holds, rounding and unsplit rest included
    bool new_segment = false;    // a segment was mapped for it
    int64_t segment_bytes = 0;   // that segment's size (0 when none was mapped)
  };

  // A segment that exists already (from a snapshot): `live` lists its
  // allocated blocks as (address, bytes); the rest of it is free.
  void AddSegment(int64_t address, int64_t bytes, int64_t stream, bool small_pool,
                  const std::vector<std::pair<int64_t, int64_t>>& live);

  // Serves `requested_bytes` on `stream`. A segment it has to map is placed at
  // `new_segment_address` when given (> 0), else after every segment so far.
  Allocation Allocate(int64_t requested_bytes, int64_t stream, int64_t new_segment_address = 0);
  // Returns the block at `address` (from Allocate or AddSegment's `live`).
  // False when no allocated block starts there.
  bool Free(int64_t address);
  // Unmaps every segment with no allocated block (emptyCache:
  // release_cached_blocks).
  void ReleaseCached();

  int64_t allocated_bytes() const { return allocated_bytes_; }
  int64_t reserved_bytes() const { return reserved_bytes_; }
  int64_t peak_allocated_bytes() const { return peak_allocated_bytes_; }
  int64_t peak_reserved_bytes() const { return peak_reserved_bytes_; }

  static int64_t RoundSize(int64_t bytes);
  static int64_t SegmentSizeFor(int64_t rounded_bytes);

 private:
  struct Block {
    int64_t bytes = 0;
    int64_t segment = 0;  // the segment's address
    int64_t stream = 0;
    bool small_pool = false;
    bool allocated = false;
  };
  using FreeKey = std::tuple<int64_t, int64_t, int64_t>;  // stream, bytes, address

  std::set<FreeKey>& PoolOf(bool small_pool) { return small_pool ? small_free_ : large_free_; }
  void InsertFree(int64_t address);
  void EraseFree(int64_t address);
  void Track(int64_t allocated_delta, int64_t reserved_delta);

  std::map<int64_t, Block> blocks_;  // by address, every block of every segment
  std::set<FreeKey> small_free_, large_free_;
  int64_t next_address_ = 1 << 30;
  int64_t allocated_bytes_ = 0, reserved_bytes_ = 0;
  int64_t peak_allocated_bytes_ = 0, peak_reserved_bytes_ = 0;
};

}  // namespace zplan

#endif  // ZPLAN_PLANNER_CACHING_ALLOCATOR_H_
