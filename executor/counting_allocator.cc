#include "executor/counting_allocator.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace zplan {
namespace {

// Priority above the default (0), so later default registrations cannot replace it.
constexpr uint8_t kAllocatorPriority = 1;
// Tags are Component values plus one internal "pending" tag for forward allocations.
constexpr int kPendingTag = COMPONENT_ALLOCATOR + 1;
constexpr int kNumTags = kPendingTag + 1;
// zrun maps every block of 1 MiB or more on its own (zrun_command.cc), so
// host RSS follows live tensors, but then each such allocation faults in
// zeroed pages and each release unmaps them: a third of a small model's CPU
// step. Freed blocks this large are kept for a later allocation that fits
// them while the blocks of live tensors plus the kept ones stay within the
// live high-water mark plus kKeptAllowanceBytes, so RSS stays within the
// tensor peak it reaches anyway plus that allowance.
constexpr int64_t kReuseMinBytes = int64_t{1} << 20;
// Near the peak nothing freed could be kept under the mark itself, and a
// small model then maps ~90 MiB anew every step (debug-tiny: 20,000 page
// faults, a quarter of its step time). 64 MiB above the mark holds those
// transients; host goals are 10% or 256 MiB (tools/accuracy.cc).
constexpr int64_t kKeptAllowanceBytes = int64_t{64} << 20;
// A kept block serves a request of at least half its size: a step's
// transients alternate between sizes (a bf16 reduce bucket, then its fp32
// upcast), and an exact-size match misses every one of them.
constexpr int64_t kMaxReuseSlack = 2;

thread_local int t_tag = COMPONENT_TEMPORARIES;

struct Record {
  int64_t bytes;
  int tag;
  int64_t id;
  int64_t block_bytes;  // >= bytes when a larger kept block serves it
};

// Hands out "simple" DataPtrs (data == context, with a raw deleter), as
// kernels that call raw_allocate() require; sizes and tags live in a side table.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    std::unique_lock<std::mutex> lock(mutex_);
    int64_t block_bytes = static_cast<int64_t>(n);
    void* data = n == 0 ? nullptr : Reuse(n, &block_bytes);
    if (n != 0 && data == nullptr) {
      std::vector<void*> evicted = Evict(n);
      lock.unlock();
      for (void* block : evicted) base_->raw_deallocate(block);
      data = base_->raw_allocate(n);
      lock.lock();
    }
    ++allocations_;
    if (data != nullptr) {
      const Record record{static_cast<int64_t>(n), t_tag, next_id_++, block_bytes};
      records_[data] = record;
      live_block_bytes_ += block_bytes;
      if (record.tag == kPendingTag) pending_.insert(data);
      Add(record.tag, record.bytes);
      Log(record.bytes, record.tag);
      if (current_ > peak_) TakePeakSnapshot();
    }
    return c10::DataPtr(data, data, &Delete, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  CpuMemoryStats Stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {current_, peak_, allocations_, cached_bytes_};
  }

  void ResetPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    TakePeakSnapshot();
  }

  MemoryBreakdown PeakBreakdown() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::array<int64_t, kNumTags> by_tag = peak_by_tag_;
    // Still pending (the peak is inside an unfinished forward part): temporaries.
    for (const auto& [id, bytes] : peak_pending_) by_tag[COMPONENT_TEMPORARIES] += bytes;
    by_tag[COMPONENT_TEMPORARIES] += by_tag[COMPONENT_UNSPECIFIED];
    MemoryBreakdown out;
    out.set_params_bytes(by_tag[COMPONENT_PARAMS]);
    out.set_grads_bytes(by_tag[COMPONENT_GRADS]);
    out.set_master_params_bytes(by_tag[COMPONENT_MASTER_PARAMS]);
    out.set_optimizer_states_bytes(by_tag[COMPONENT_OPTIMIZER_STATES]);
    out.set_activations_bytes(by_tag[COMPONENT_ACTIVATIONS]);
    out.set_logits_bytes(by_tag[COMPONENT_LOGITS]);
    out.set_buffers_bytes(by_tag[COMPONENT_BUFFERS]);
    out.set_temporaries_bytes(by_tag[COMPONENT_TEMPORARIES]);
    out.set_runtime_bytes(by_tag[COMPONENT_RUNTIME]);
    out.set_allocator_bytes(by_tag[COMPONENT_ALLOCATOR]);
    out.set_peak_bytes(peak_);
    return out;
  }

  void EnableLog(bool enabled) {
    std::lock_guard<std::mutex> lock(mutex_);
    log_enabled_ = enabled;
    log_.clear();
  }

  std::vector<AllocationEvent> TakeLog() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<AllocationEvent> out;
    out.swap(log_);
    return out;
  }

  void Settle() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unordered_set<int64_t> surviving;
    for (void* data : pending_) {
      Record& record = records_.at(data);
      surviving.insert(record.id);
      Add(kPendingTag, -record.bytes);
      Add(COMPONENT_ACTIVATIONS, record.bytes);
      record.tag = COMPONENT_ACTIVATIONS;
    }
    pending_.clear();
    for (const auto& [id, bytes] : peak_pending_) {
      peak_by_tag_[surviving.count(id) > 0 ? COMPONENT_ACTIVATIONS : COMPONENT_TEMPORARIES] += bytes;
    }
    peak_pending_.clear();
  }

  void Tag(const void* data, int tag) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = records_.find(const_cast<void*>(data));
    if (it == records_.end() || it->second.tag == tag) return;
    if (it->second.tag == kPendingTag) pending_.erase(it->first);
    Add(it->second.tag, -it->second.bytes);
    Add(tag, it->second.bytes);
    it->second.tag = tag;
  }

  void Free(void* data) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = records_.find(data);
      if (it != records_.end()) {
        const int64_t bytes = it->second.bytes, block = it->second.block_bytes;
        Add(it->second.tag, -bytes);
        Log(-bytes, it->second.tag);
        if (it->second.tag == kPendingTag) pending_.erase(data);
        records_.erase(it);
        live_block_bytes_ -= block;
        if (block >= kReuseMinBytes && WithinMark(block)) {
          reusable_.emplace(block, data);
          cached_bytes_ += block;
          return;
        }
      }
    }
    base_->raw_deallocate(data);
  }

 private:
  static void Delete(void* data);

  void Log(int64_t bytes, int tag) {
    if (log_enabled_) log_.push_back({bytes, tag, current_});
  }

  void Add(int tag, int64_t bytes) {
    live_by_tag_[tag] += bytes;
    current_ += bytes;
    high_water_ = std::max(high_water_, current_);
  }

  // The smallest kept block that holds n bytes and is at most kMaxReuseSlack
  // times larger (its size in *block_bytes), or null.
  void* Reuse(size_t n, int64_t* block_bytes) {
    auto it = reusable_.lower_bound(static_cast<int64_t>(n));
    if (it == reusable_.end() || it->first > kMaxReuseSlack * static_cast<int64_t>(n)) return nullptr;
    void* data = it->second;
    *block_bytes = it->first;
    cached_bytes_ -= it->first;
    reusable_.erase(it);
    return data;
  }

  // Whether live and kept blocks plus `more` bytes stay within the live
  // high-water mark plus the allowance.
  bool WithinMark(int64_t more) const {
    return live_block_bytes_ + cached_bytes_ + more <= high_water_ + kKeptAllowanceBytes;
  }

  // Kept blocks to release, largest first, until n more bytes are WithinMark.
  std::vector<void*> Evict(size_t n) {
    std::vector<void*> out;
    while (!reusable_.empty() && !WithinMark(static_cast<int64_t>(n))) {
      auto last = std::prev(reusable_.end());
      cached_bytes_ -= last->first;
      out.push_back(last->second);
      reusable_.erase(last);
    }
    return out;
  }

  // The live breakdown becomes the peak's; pending bytes are kept by id
  // so Settle() can classify them.
  void TakePeakSnapshot() {
    peak_ = current_;
    peak_by_tag_ = live_by_tag_;
    peak_by_tag_[kPendingTag] = 0;
    peak_pending_.clear();
    for (void* data : pending_) {
      const Record& record = records_.at(data);
      peak_pending_.emplace_back(record.id, record.bytes);
    }
  }

  c10::Allocator* base_;
  std::mutex mutex_;
  std::unordered_map<void*, Record> records_;
  std::unordered_set<void*> pending_;
  std::array<int64_t, kNumTags> live_by_tag_{}, peak_by_tag_{};
  std::vector<std::pair<int64_t, int64_t>> peak_pending_;  // (id, bytes) pending at the peak
  int64_t current_ = 0, peak_ = 0, allocations_ = 0, next_id_ = 0;
  bool log_enabled_ = false;
  // Freed blocks kept for a later allocation, by size (see kReuseMinBytes).
  std::multimap<int64_t, void*> reusable_;
  int64_t cached_bytes_ = 0;
  int64_t live_block_bytes_ = 0;  // the blocks under live tensors: current_ plus reuse slack
  int64_t high_water_ = 0;  // the largest live total ever (ResetPeak leaves it)
  std::vector<AllocationEvent> log_;
};

CountingCpuAllocator* g_allocator = nullptr;  // never destroyed: tensors may outlive main
std::once_flag g_install_once;

void CountingCpuAllocator::Delete(void* data) {
  if (data != nullptr) g_allocator->Free(data);
}

}  // namespace

bool InstallCountingCpuAllocator() {
  std::call_once(g_install_once, [] {
    g_allocator = new CountingCpuAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(g_allocator, kAllocatorPriority);
  });
  return c10::GetCPUAllocator() == g_allocator;
}

CpuMemoryStats GetCpuMemoryStats() { return g_allocator != nullptr ? g_allocator->Stats() : CpuMemoryStats{}; }

void ResetCpuPeak() {
  if (g_allocator != nullptr) g_allocator->ResetPeak();
}

MemoryBreakdown GetCpuPeakBreakdown() {
  return g_allocator != nullptr ? g_allocator->PeakBreakdown() : MemoryBreakdown{};
}

void SetMemoryTag(Component component) { t_tag = component; }

void BeginForwardPart() { t_tag = kPendingTag; }

void SettleForwardPart(Component next) {
  if (g_allocator != nullptr) g_allocator->Settle();
  t_tag = next;
}

void TagAllocation(const void* data, Component component) {
  if (g_allocator != nullptr && data != nullptr) g_allocator->Tag(data, component);
}

void EnableAllocationLog(bool enabled) {
  if (g_allocator != nullptr) g_allocator->EnableLog(enabled);
}

std::vector<AllocationEvent> TakeAllocationLog() {
  return g_allocator != nullptr ? g_allocator->TakeLog() : std::vector<AllocationEvent>{};
}

ScopedMemoryTag::ScopedMemoryTag(Component component) : previous_(t_tag) { t_tag = component; }
ScopedMemoryTag::~ScopedMemoryTag() { t_tag = previous_; }

}  // namespace zplan
