// File: counting_allocator_c_api.cc
// A C ABI over counting_allocator.h, built as libzplan_counting_allocator.so
// so that a Python process (the DeepSpeed oracle, tools/deepspeed_oracle.py)
// measures its CPU tensors with the same allocator zrun uses. Load it with
// ctypes after `import torch` (it links the same libc10) and call
// zplan_install() before the model exists. Tags are proto/memory.proto's
// Component numbers.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <c10/core/TensorImpl.h>

#include "executor/counting_allocator.h"

extern "C" {

int zplan_install() { return zplan::InstallCountingCpuAllocator() ? 1 : 0; }

int64_t zplan_current_bytes() { return zplan::GetCpuMemoryStats().current_bytes; }

int64_t zplan_peak_bytes() { return zplan::GetCpuMemoryStats().peak_bytes; }

void zplan_reset_peak() { zplan::ResetCpuPeak(); }

void zplan_set_tag(int component) { zplan::SetMemoryTag(static_cast<zplan::Component>(component)); }

void zplan_begin_forward_part() { zplan::BeginForwardPart(); }

void zplan_settle_forward_part(int next) {
  zplan::SettleForwardPart(static_cast<zplan::Component>(next));
}

void zplan_tag_allocation(const void* data, int component) {
  zplan::TagAllocation(data, static_cast<zplan::Component>(component));
}

// Writes the peak's bytes per Component number (index 0 unused) into
// out[0..n) and returns the peak; see GetCpuPeakBreakdown().
int64_t zplan_peak_breakdown(int64_t* out, int n) {
  const zplan::MemoryBreakdown b = zplan::GetCpuPeakBreakdown();
  const int64_t by_component[] = {0,
                                  b.params_bytes(),
                                  b.grads_bytes(),
                                  b.master_params_bytes(),
                                  b.optimizer_states_bytes(),
                                  b.activations_bytes(),
                                  b.logits_bytes(),
                                  b.buffers_bytes(),
                                  b.temporaries_bytes(),
                                  b.runtime_bytes(),
                                  b.allocator_bytes()};
  for (int i = 0; i < n && i < static_cast<int>(sizeof(by_component) / sizeof(by_component[0])); ++i) {
    out[i] = by_component[i];
  }
  return b.peak_bytes();
}

void zplan_log_enable(int enabled) { zplan::EnableAllocationLog(enabled != 0); }

// Moves up to `max_events` logged events into out as (bytes, tag,
// live_bytes) triples and returns how many; the rest stay for the next call.
int64_t zplan_log_take(int64_t* out, int64_t max_events) {
  static std::vector<zplan::AllocationEvent> pending;
  std::vector<zplan::AllocationEvent> fresh = zplan::TakeAllocationLog();
  pending.insert(pending.end(), fresh.begin(), fresh.end());
  const int64_t n = std::min<int64_t>(max_events, static_cast<int64_t>(pending.size()));
  for (int64_t i = 0; i < n; ++i) {
    out[3 * i] = pending[i].bytes;
    out[3 * i + 1] = pending[i].tag;
    out[3 * i + 2] = pending[i].live_bytes;
  }
  pending.erase(pending.begin(), pending.begin() + n);
  return n;
}

// Strong references to a tensor (its TensorImpl: Python's Tensor._cdata).
// The oracle watches it to see when a collective's worker thread lets go.
int64_t zplan_tensor_use_count(void* tensor_impl) {
  return static_cast<int64_t>(c10::raw::intrusive_ptr::use_count(static_cast<c10::TensorImpl*>(tensor_impl)));
}

}  // extern "C"
