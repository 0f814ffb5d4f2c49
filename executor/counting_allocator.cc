#include "executor/counting_allocator.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace zplan {
namespace {

// Priority above the default (0), so later default registrations cannot replace it.
constexpr uint8_t kAllocatorPriority = 1;

// Hands out "simple" DataPtrs (data == context, with a raw deleter), as
// kernels that call raw_allocate() require; sizes live in a side table.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    void* data = n == 0 ? nullptr : base_->raw_allocate(n);
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = static_cast<int64_t>(n);
    }
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    allocations_.fetch_add(1);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return c10::DataPtr(data, data, &Delete, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  CpuMemoryStats Stats() const { return {current_.load(), peak_.load(), allocations_.load()}; }
  void ResetPeak() { peak_.store(current_.load()); }

 private:
  static void Delete(void* data);

  c10::Allocator* base_;
  std::mutex mutex_;
  std::unordered_map<void*, int64_t> sizes_;
  std::atomic<int64_t> current_{0}, peak_{0}, allocations_{0};
};

CountingCpuAllocator* g_allocator = nullptr;  // never destroyed: tensors may outlive main
std::once_flag g_install_once;

void CountingCpuAllocator::Delete(void* data) {
  if (data == nullptr) return;
  CountingCpuAllocator* self = g_allocator;
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(self->mutex_);
    auto it = self->sizes_.find(data);
    if (it != self->sizes_.end()) {
      bytes = it->second;
      self->sizes_.erase(it);
    }
  }
  self->current_.fetch_sub(bytes);
  self->base_->raw_deallocate(data);
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

}  // namespace zplan
