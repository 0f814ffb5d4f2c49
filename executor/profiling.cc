#include "executor/profiling.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/proto_io.h"

namespace zplan {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

constexpr int kTopKernels = 15;
constexpr size_t kNameChars = 96;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::set<ActivityType> Activities(const at::Device& device) {
  if (device.is_cuda()) return {ActivityType::CPU, ActivityType::CUDA};
  return {ActivityType::CPU};
}

absl::Status RenameInto(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

// Wall time, the device's busy time (the union of its kernel and copy
// intervals: streams overlap) and the device events that took most.
std::string Summarize(const std::vector<prof::KinetoEvent>& events, double wall_seconds) {
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  std::map<std::string, std::pair<uint64_t, int>> by_name;  // total ns, count
  for (const prof::KinetoEvent& e : events) {
    if (e.deviceType() != c10::DeviceType::CUDA || e.durationNs() == 0) continue;
    intervals.emplace_back(e.startNs(), e.endNs());
    auto& [ns, count] = by_name[e.name().substr(0, kNameChars)];
    ns += e.durationNs();
    ++count;
  }
  std::string out = absl::StrFormat("traced step: %.1f ms wall", wall_seconds * 1e3);
  if (intervals.empty()) return out + " (no device events: CPU rank)\n";
  std::sort(intervals.begin(), intervals.end());
  uint64_t busy_ns = 0, end = 0;
  for (const auto& [a, b] : intervals) {
    if (b <= end) continue;
    busy_ns += b - std::max(a, end);
    end = b;
  }
  const uint64_t span_ns = intervals.back().second - intervals.front().first;
  absl::StrAppendFormat(&out, ", device busy %.1f ms of its %.1f ms span (%.0f%%), %d device events\n",
                        busy_ns / 1e6, span_ns / 1e6, 100.0 * busy_ns / std::max<uint64_t>(span_ns, 1),
                        static_cast<int>(intervals.size()));
  std::vector<std::pair<uint64_t, std::string>> top;
  for (const auto& [name, v] : by_name) top.emplace_back(v.first, name);
  std::sort(top.rbegin(), top.rend());
  for (int i = 0; i < std::min<int>(kTopKernels, top.size()); ++i) {
    absl::StrAppendFormat(&out, "  %8.2f ms %5.1f%% %6d x  %s\n", top[i].first / 1e6,
                          100.0 * top[i].first / std::max<uint64_t>(busy_ns, 1), by_name[top[i].second].second,
                          top[i].second);
  }
  return out;
}

}  // namespace

void StepTrace::Start(const at::Device& device) {
  device_ = device;
  if (device.is_cuda()) c10::cuda::device_synchronize();
  const ProfilerConfig config(ProfilerState::KINETO);
  prof::prepareProfiler(config, Activities(device));
  prof::enableProfiler(config, Activities(device));
  running_ = true;
  started_ns_ = NowNs();
}

absl::StatusOr<std::string> StepTrace::Finish(const std::string& path) {
  if (!running_) return absl::FailedPreconditionError("StepTrace::Finish without Start");
  running_ = false;
  if (device_.is_cuda()) c10::cuda::device_synchronize();
  const double wall_seconds = (NowNs() - started_ns_) / 1e9;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  const std::string tmp = path + ".tmp";
  result->save(tmp);
  if (absl::Status s = RenameInto(tmp, path); !s.ok()) return s;
  return Summarize(result->events(), wall_seconds);
}

void StartMemoryHistory(const at::Device& device) {
  if (!device.is_cuda()) return;
  // Every allocation, free and segment event; no stack contexts (there is
  // no Python, and C++ unwinding per allocation would dominate the step).
  constexpr size_t kMaxEntries = 2'000'000;
  torch::cuda::_record_memory_history("all", std::nullopt, "python", kMaxEntries);
}

absl::Status WriteMemorySnapshot(const at::Device& device, const std::string& path) {
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError("a memory snapshot needs a CUDA rank (the caching allocator's history)");
  }
  return WriteFileAtomically(path, torch::cuda::_memory_snapshot_pickled());
}

}  // namespace zplan
