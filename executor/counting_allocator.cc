#include "executor/counting_allocator.h"

#include <atomic>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace zplan {
namespace {

// Priority above the default (0), so later default registrations cannot replace it.
constexpr uint8_t kAllocatorPriority = 1;

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    allocations_.fetch_add(1);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    // The context owns the inner DataPtr (freed with it) and remembers the size.
    return c10::DataPtr(data, new Context{std::move(inner), static_cast<int64_t>(n), this}, &Delete, device);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  CpuMemoryStats Stats() const { return {current_.load(), peak_.load(), allocations_.load()}; }
  void ResetPeak() { peak_.store(current_.load()); }

 private:
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
    CountingCpuAllocator* owner;
  };

  static void Delete(void* ctx) {
    auto* context = static_cast<Context*>(ctx);
    context->owner->current_.fetch_sub(context->bytes);
    delete context;  // ~DataPtr frees the memory through the base allocator
  }

  c10::Allocator* base_;
  std::atomic<int64_t> current_{0}, peak_{0}, allocations_{0};
};

CountingCpuAllocator* g_allocator = nullptr;  // never destroyed: tensors may outlive main
std::once_flag g_install_once;

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
