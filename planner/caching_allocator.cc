#include "planner/caching_allocator.h"

#include <algorithm>
#include <iterator>

#include "planner/status_macros.h"

namespace zplan {

int64_t CachingAllocatorModel::RoundSize(int64_t bytes) {
  if (bytes < kAllocatorMinBlockBytes) return kAllocatorMinBlockBytes;
  return kAllocatorMinBlockBytes * ((bytes + kAllocatorMinBlockBytes - 1) / kAllocatorMinBlockBytes);
}

int64_t CachingAllocatorModel::SegmentSizeFor(int64_t rounded_bytes) {
  if (rounded_bytes <= kAllocatorSmallSizeBytes) return kAllocatorSmallBufferBytes;
  if (rounded_bytes < kAllocatorMinLargeAllocBytes) return kAllocatorLargeBufferBytes;
  return kAllocatorRoundLargeBytes * ((rounded_bytes + kAllocatorRoundLargeBytes - 1) / kAllocatorRoundLargeBytes);
}

void CachingAllocatorModel::Track(int64_t allocated_delta, int64_t reserved_delta) {
  allocated_bytes_ += allocated_delta;
  reserved_bytes_ += reserved_delta;
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  peak_reserved_bytes_ = std::max(peak_reserved_bytes_, reserved_bytes_);
}

void CachingAllocatorModel::InsertFree(int64_t address) {
  const Block& b = blocks_.at(address);
  PoolOf(b.small_pool).insert({b.stream, b.bytes, address});
}

void CachingAllocatorModel::EraseFree(int64_t address) {
  const Block& b = blocks_.at(address);
  PoolOf(b.small_pool).erase({b.stream, b.bytes, address});
}

void CachingAllocatorModel::AddSegment(int64_t address, int64_t bytes, int64_t stream, bool small_pool,
                                       const std::vector<std::pair<int64_t, int64_t>>& live) {
  std::vector<std::pair<int64_t, int64_t>> sorted = live;
  std::sort(sorted.begin(), sorted.end());
  Track(0, bytes);
  int64_t at = address;
  auto add = [&](int64_t start, int64_t size, bool allocated) {
    blocks_[start] = Block{size, address, stream, small_pool, allocated};
    if (allocated) {
      Track(size, 0);
    } else {
      InsertFree(start);
    }
  };
  for (const auto& [start, size] : sorted) {
    ZPLAN_CHECK(start >= at && start + size <= address + bytes);  // live blocks lie inside, apart
    if (start > at) add(at, start - at, false);
    add(start, size, true);
    at = start + size;
  }
  if (at < address + bytes) add(at, address + bytes - at, false);
  next_address_ = std::max(next_address_, address + bytes);
}

CachingAllocatorModel::Allocation CachingAllocatorModel::Allocate(int64_t requested_bytes, int64_t stream,
                                                                  int64_t new_segment_address) {
  const int64_t size = RoundSize(requested_bytes);
  const bool small_pool = size <= kAllocatorSmallSizeBytes;
  std::set<FreeKey>& pool = PoolOf(small_pool);
  Allocation result;
  auto it = pool.lower_bound({stream, size, 0});
  int64_t address;
  if (it != pool.end() && std::get<0>(*it) == stream) {
    address = std::get<2>(*it);
    pool.erase(it);
  } else {
    result.new_segment = true;
    result.segment_bytes = SegmentSizeFor(size);
    address = new_segment_address > 0 ? new_segment_address : next_address_;
    next_address_ = std::max(next_address_, address + result.segment_bytes);
    blocks_[address] = Block{result.segment_bytes, address, stream, small_pool, false};
    Track(0, result.segment_bytes);
  }
  Block& block = blocks_.at(address);
  const int64_t remaining = block.bytes - size;
  if (small_pool ? remaining >= kAllocatorMinBlockBytes : remaining > kAllocatorSmallSizeBytes) {
    blocks_[address + size] = Block{remaining, block.segment, stream, small_pool, false};
    block.bytes = size;
    InsertFree(address + size);
  }
  Block& taken = blocks_.at(address);
  taken.allocated = true;
  Track(taken.bytes, 0);
  result.address = address;
  result.block_bytes = taken.bytes;
  return result;
}

bool CachingAllocatorModel::Free(int64_t address) {
  auto it = blocks_.find(address);
  if (it == blocks_.end() || !it->second.allocated) return false;
  it->second.allocated = false;
  Track(-it->second.bytes, 0);
  // Merge with the free neighbours in the same segment.
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.segment == it->second.segment && !next->second.allocated) {
    EraseFree(next->first);
    it->second.bytes += next->second.bytes;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.segment == it->second.segment && !prev->second.allocated) {
      EraseFree(prev->first);
      prev->second.bytes += it->second.bytes;
      blocks_.erase(it);
      it = prev;
    }
  }
  InsertFree(it->first);
  return true;
}

void CachingAllocatorModel::ReleaseCached() {
  // A segment with nothing allocated is one free block (frees merge).
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    const auto next = std::next(it);
    const Block& b = it->second;
    const bool whole = it->first == b.segment && (next == blocks_.end() || next->second.segment != b.segment);
    if (whole && !b.allocated) {
      EraseFree(it->first);
      Track(0, -b.bytes);
      blocks_.erase(it);
    }
    it = next;
  }
}

}  // namespace zplan
