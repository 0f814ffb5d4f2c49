#include "planner/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace zplan {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(CachingAllocatorModelTest, SizeClassesAsPyTorch) {
  EXPECT_EQ(CachingAllocatorModel::RoundSize(1), 512);
  EXPECT_EQ(CachingAllocatorModel::RoundSize(513), 1024);
  EXPECT_EQ(CachingAllocatorModel::SegmentSizeFor(kMiB), 2 * kMiB);        // small pool
  EXPECT_EQ(CachingAllocatorModel::SegmentSizeFor(kMiB + 512), 20 * kMiB);  // 1-10 MiB
  EXPECT_EQ(CachingAllocatorModel::SegmentSizeFor(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::SegmentSizeFor(10 * kMiB + 1), 12 * kMiB);
}

TEST(CachingAllocatorModelTest, SplitsReusesAndNeverMerges) {
  CachingAllocatorModel m;
  const auto a = m.Allocate(8 * kMiB, 0);  // a 20 MiB segment, split
  EXPECT_TRUE(a.new_segment);
  EXPECT_EQ(a.segment_bytes, 20 * kMiB);
  const auto b = m.Allocate(8 * kMiB, 0);  // the rest of it
  EXPECT_FALSE(b.new_segment);
  EXPECT_EQ(b.address, a.address + 8 * kMiB);
  const auto c = m.Allocate(4 * kMiB, 0);  // the last 4 MiB, whole
  EXPECT_FALSE(c.new_segment);
  EXPECT_EQ(c.address, a.address + 16 * kMiB);
  ASSERT_TRUE(m.Free(a.address));
  ASSERT_TRUE(m.Free(b.address));          // merges with a: 16 MiB free
  const auto d = m.Allocate(16 * kMiB, 0);
  EXPECT_FALSE(d.new_segment);
  EXPECT_EQ(d.address, a.address);
  // A request larger than any free block maps a segment even though the
  // free bytes of several segments would add up to it.
  ASSERT_TRUE(m.Free(d.address));
  const auto e = m.Allocate(18 * kMiB, 0);
  EXPECT_TRUE(e.new_segment);
  EXPECT_EQ(e.segment_bytes, 18 * kMiB);
  EXPECT_EQ(m.peak_reserved_bytes(), 38 * kMiB);
  EXPECT_FALSE(m.Free(e.address + 1));  // no block starts there
}

TEST(CachingAllocatorModelTest, ReleaseCachedUnmapsOnlyEmptySegments) {
  CachingAllocatorModel m;
  const auto a = m.Allocate(8 * kMiB, 0);   // a 20 MiB segment
  const auto b = m.Allocate(30 * kMiB, 0);  // its own 30 MiB segment
  m.Allocate(2 * kMiB, 0);                  // in a's segment, kept
  ASSERT_TRUE(m.Free(a.address));
  ASSERT_TRUE(m.Free(b.address));
  m.ReleaseCached();
  EXPECT_EQ(m.reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(m.peak_reserved_bytes(), 50 * kMiB);
  EXPECT_FALSE(m.Allocate(8 * kMiB, 0).new_segment);  // a's block is still cached
  EXPECT_TRUE(m.Allocate(30 * kMiB, 0).new_segment);
}

TEST(CachingAllocatorModelTest, RemaindersUpToOneMiBStayWithTheLargeBlock) {
  CachingAllocatorModel m;
  const auto a = m.Allocate(11 * kMiB - 4096, 0);  // a 12 MiB segment, 1 MiB + 4 KiB left: split
  EXPECT_EQ(a.block_bytes, 11 * kMiB - 4096);
  CachingAllocatorModel n;
  const auto b = n.Allocate(11 * kMiB + 4096, 0);  // 12 MiB segment, under 1 MiB left: whole
  EXPECT_EQ(b.block_bytes, 12 * kMiB);
}

TEST(CachingAllocatorModelTest, StreamsKeepTheirOwnBlocks) {
  CachingAllocatorModel m;
  const auto a = m.Allocate(30 * kMiB, /*stream=*/1);
  ASSERT_TRUE(m.Free(a.address));
  EXPECT_TRUE(m.Allocate(30 * kMiB, /*stream=*/2).new_segment);
  EXPECT_FALSE(m.Allocate(30 * kMiB, /*stream=*/1).new_segment);
}

// One rank's recorded history (docs/gpu_traces/README.md), replayed: every
// allocation must land where the real allocator put it, and every segment the
// real one mapped must be mapped by the model at the same moment.
struct Replay {
  int64_t allocations = 0, placed_alike = 0, segments_recorded = 0, segments_modelled = 0;
  int64_t segments_alike = 0;
  int64_t peak_reserved_recorded_delta = 0, peak_reserved_modelled_delta = 0;
  // Peak reserved from the `measured_from` step marker on (recorded; modelled).
  int64_t measured_peak_reserved_recorded = 0, measured_peak_reserved_modelled = 0;
  std::string first_difference;
};

int64_t Field(const std::string& line, const std::string& key) {
  const size_t at = line.find(key + "=");
  return at == std::string::npos ? -1 : std::stoll(line.substr(at + key.size() + 1));
}

// With `free_at_request` every block comes back as soon as it is freed, as
// if no other stream had used it: what the offload stream's waits cost.
// `measured_from`: the '# step N' marker from which the measured peaks count;
// with `empty_cache` the model releases its cache there (zrun's and the
// plan's ResetDevicePeak after the warm-up) and maps its own segments after.
Replay ReplayTrace(const std::string& path, bool free_at_request = false, int measured_from = 0,
                   bool empty_cache = false) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  struct Seg { int64_t address, bytes, stream; bool small; std::vector<std::pair<int64_t, int64_t>> active; };
  std::vector<Seg> segments;
  struct Event { std::string action; int64_t size, addr, stream; };
  std::vector<Event> events;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# segment ", 0) == 0) {
      segments.push_back({Field(line, "address"), Field(line, "total_size"), Field(line, "stream"),
                          line.find("type=small") != std::string::npos, {}});
    } else if (line.rfind("#   block ", 0) == 0) {
      if (line.find("state=active") != std::string::npos) {
        segments.back().active.push_back({Field(line, "address"), Field(line, "size")});
      }
    } else if (line.rfind("# step ", 0) == 0) {
      events.push_back({"step", std::stoll(line.substr(7)), 0, 0});
    } else if (!line.empty() && line[0] != '#' && line.rfind("time_us", 0) != 0) {
      std::istringstream f(line);
      int64_t t;
      Event e;
      f >> t >> e.action >> e.size >> e.addr >> e.stream;
      events.push_back(e);
    }
  }
  // The state the history starts from: segments it did not map, holding the
  // blocks still active at its end that it did not allocate and the blocks
  // it frees without having allocated them.
  std::set<int64_t> mapped, allocated;
  std::map<int64_t, int64_t> live_at_start;  // address -> bytes
  for (const Event& e : events) {
    if (e.action == "segment_alloc") mapped.insert(e.addr);
    if (e.action == "alloc") allocated.insert(e.addr);
    if (e.action == "free_completed" && !allocated.count(e.addr)) {
      live_at_start[e.addr] = CachingAllocatorModel::RoundSize(e.size);
    }
  }
  CachingAllocatorModel model;
  for (const Seg& s : segments) {
    if (mapped.count(s.address)) continue;
    std::vector<std::pair<int64_t, int64_t>> live;
    for (const auto& [a, n] : s.active) {
      if (!allocated.count(a)) live.push_back({a, n});
    }
    for (const auto& [a, n] : live_at_start) {
      if (a >= s.address && a < s.address + s.bytes) live.push_back({a, n});
    }
    model.AddSegment(s.address, s.bytes, s.stream, s.small, live);
  }
  Replay r;
  const int64_t reserved_at_start = model.reserved_bytes();
  int64_t pending_segment = 0, recorded_reserved = 0, recorded_peak = 0;
  std::map<int64_t, int64_t> modelled_address;  // recorded -> modelled, where they differ
  bool measuring = measured_from == 0, emptied = false, releasing = false;
  for (const Event& e : events) {
    if (e.action == "step" && e.size == measured_from) {
      measuring = true;
      if (empty_cache) {
        model.ReleaseCached();
        emptied = true;
      }
    } else if (e.action == "segment_alloc") {
      pending_segment = e.addr;
      ++r.segments_recorded;
      recorded_reserved += e.size;
      recorded_peak = std::max(recorded_peak, recorded_reserved);
    } else if (e.action == "segment_free") {
      // emptyCache (DeepSpeed calls it in ZeRO-3's setup) unmaps every free segment at once.
      if (!releasing) model.ReleaseCached();
      recorded_reserved -= e.size;
    } else if (e.action == "alloc") {
      ++r.allocations;
      const auto a = model.Allocate(e.size, e.stream, free_at_request || emptied ? 0 : pending_segment);
      r.segments_modelled += a.new_segment;
      r.segments_alike += a.new_segment && pending_segment == a.address;
      modelled_address[e.addr] = a.address;
      if (a.address == e.addr) {
        ++r.placed_alike;
      } else if (r.first_difference.empty()) {
        r.first_difference = "allocation " + std::to_string(r.allocations) + " of " + std::to_string(e.size) +
                             " B: recorded at " + std::to_string(e.addr) + ", modelled at " +
                             std::to_string(a.address) + (a.new_segment ? " (new segment)" : "");
      }
      pending_segment = 0;
    } else if (e.action == (free_at_request ? "free_requested" : "free_completed")) {
      const auto it = modelled_address.find(e.addr);
      EXPECT_TRUE(model.Free(it == modelled_address.end() ? e.addr : it->second)) << e.addr;
    }
    releasing = e.action == "segment_free";
    if (measuring) {
      r.measured_peak_reserved_recorded = std::max(r.measured_peak_reserved_recorded, recorded_reserved);
      r.measured_peak_reserved_modelled = std::max(r.measured_peak_reserved_modelled, model.reserved_bytes());
    }
  }
  r.peak_reserved_recorded_delta = recorded_peak;
  r.peak_reserved_modelled_delta = model.peak_reserved_bytes() - reserved_at_start;
  return r;
}

class RecordedH100Trace : public ::testing::TestWithParam<std::string> {};

TEST_P(RecordedH100Trace, ReplaysAsTheRealAllocator) {
  const std::string path =
      std::string(std::getenv("TEST_SRCDIR")) + "/zplan/planner/gpu_traces/" + GetParam() + ".tsv";
  const Replay r = ReplayTrace(path);
  ASSERT_GT(r.allocations, 1000);
  std::cout << GetParam() << ": " << r.placed_alike << " of " << r.allocations << " allocations placed alike, "
            << r.segments_alike << " of " << r.segments_recorded << " segments, reserved grew by "
            << r.peak_reserved_modelled_delta << " B (recorded " << r.peak_reserved_recorded_delta << " B)\n";
  EXPECT_EQ(r.placed_alike, r.allocations) << r.first_difference;
  EXPECT_EQ(r.segments_modelled, r.segments_recorded);
  EXPECT_EQ(r.segments_alike, r.segments_recorded);
  EXPECT_EQ(r.peak_reserved_modelled_delta, r.peak_reserved_recorded_delta);
  const Replay undelayed = ReplayTrace(path, /*free_at_request=*/true);
  std::cout << "  without waiting for other streams, reserved would grow by " << undelayed.peak_reserved_modelled_delta
            << " B\n";
}

// Real DeepSpeed + transformers on an H100 or an H200 (tools/gpu_deepspeed.sh), each
// history from an empty pool: DeepSpeed's initialize, the warm-up step, then
// two measured steps. The model must place every request as the real
// allocator did; then, replayed with the cache emptied after the warm-up
// (as zrun and the plan's replay do), the same requests reserve what the
// plan predicts, so a reserved miss against DeepSpeed is the pool its
// initialize and warm-up leave behind (docs/gpu_validation.md).
class RecordedDeepSpeedTrace : public ::testing::TestWithParam<std::string> {};

TEST_P(RecordedDeepSpeedTrace, ReplaysAsTheRealAllocator) {
  const std::string path =
      std::string(std::getenv("TEST_SRCDIR")) + "/zplan/planner/gpu_traces/" + GetParam() + ".tsv";
  const Replay r = ReplayTrace(path, /*free_at_request=*/false, /*measured_from=*/1);
  ASSERT_GT(r.allocations, 1000);
  EXPECT_EQ(r.placed_alike, r.allocations) << r.first_difference;
  EXPECT_EQ(r.segments_alike, r.segments_recorded);
  EXPECT_EQ(r.measured_peak_reserved_modelled, r.measured_peak_reserved_recorded);
  const Replay emptied = ReplayTrace(path, /*free_at_request=*/false, /*measured_from=*/1, /*empty_cache=*/true);
  const Replay undelayed = ReplayTrace(path, /*free_at_request=*/true, /*measured_from=*/1, /*empty_cache=*/true);
  std::cout << GetParam() << ": peak reserved over the measured steps " << r.measured_peak_reserved_recorded
            << " B; with the cache emptied after the warm-up " << emptied.measured_peak_reserved_modelled
            << " B, and without waiting for other streams " << undelayed.measured_peak_reserved_modelled << " B\n";
}

// Every deepspeed_* history planner/BUILD unpacks (_DEEPSPEED_TRACES).
std::vector<std::string> DeepSpeedTraces() {
  std::vector<std::string> names;
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir == nullptr) return names;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(srcdir) + "/zplan/planner/gpu_traces")) {
    const std::string name = entry.path().stem().string();
    if (name.rfind("deepspeed_", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Hopper, RecordedDeepSpeedTrace, ::testing::ValuesIn(DeepSpeedTraces()));


INSTANTIATE_TEST_SUITE_P(H100, RecordedH100Trace,
                         ::testing::Values("qwen3-0.6b_s2048_mb2_zero0_nccl1",
                                           "seed000_1b_s8192_mb2_zero3_offload_rank3of4",
                                           "seed000_1b_s8192_mb4_zero3_offload_rank3of4",
                                           "zeroinit_70e9_s2048_mb1_zero3_ckpt_rank63of64"));

}  // namespace
}  // namespace zplan
