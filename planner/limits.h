// File: limits.h
// Bounds on every number that enters zplan or zrun -- flags, config.json,
// ds_config.json, a ModelSpec textproto, a plan -- so that none is taken
// that no real run has, and no byte count derived from accepted numbers can
// overflow int64. Each bound sits far above the largest published training
// runs (Llama 3.1 405B: 126 layers, width 16384, FFN 53248; Gemma's 256k
// vocabulary; clusters of ~100k GPUs). ValidateModelSpec and
// ValidateRunConfig apply the per-field bounds; ValidateSizes bounds the
// products (computed in double, so the check itself cannot overflow).
// Messages name the field, the bound and the fix.
//
// Example:
//   ZPLAN_RETURN_IF_ERROR(CheckRange("--seq", seq, 1, kMaxSeqLength, "tokens per sequence"));
#ifndef ZPLAN_PLANNER_LIMITS_H_
#define ZPLAN_PLANNER_LIMITS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// Model shape.
inline constexpr int64_t kMaxLayers = 2048;
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 17;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxHeadDim = 4096;
inline constexpr int64_t kMaxFfnSize = int64_t{1} << 20;
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 22;
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;  // a mixture of experts' experts per layer
inline constexpr int64_t kMaxParameters = int64_t{1} << 47;  // 140 trillion elements
// Run shape. The planner's cost grows with the world size (one sharding
// variant per rank class): 2^18 ranks plan in under a second.
inline constexpr int64_t kMaxSeqLength = int64_t{1} << 24;
inline constexpr int64_t kMaxImageSize = int64_t{1} << 16;  // pixels per side
inline constexpr int64_t kMaxImageChannels = 1024;
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 16;
inline constexpr int64_t kMaxGradAccum = int64_t{1} << 16;
inline constexpr int64_t kMaxGpusPerNode = 1024;
inline constexpr int64_t kMaxNodes = int64_t{1} << 17;
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 18;
inline constexpr int64_t kMaxBucketElements = int64_t{1} << 40;
inline constexpr int64_t kMaxTrainSteps = 10'000'000;
// JSON numbers are doubles: integers beyond 2^53 are not exact, and beyond
// 2^63 not even representable.
inline constexpr double kMaxExactJsonInteger = 9007199254740992.0;
// Memory sizes given in GiB (--budget-gib, --host-ram-gib): up to 1 PiB.
inline constexpr double kMaxGiB = 1 << 20;
// No derived byte count (a tensor, a component, a peak) may exceed 2^60
// bytes (1 EiB): sums of a few dozen of them stay below 2^63.
inline constexpr double kMaxDerivedBytes = static_cast<double>(int64_t{1} << 60);

// kInvalidArgument "<field>: <value> is outside <min> .. <max> (<meaning>)"
// unless min <= value <= max.
absl::Status CheckRange(absl::string_view field, int64_t value, int64_t min, int64_t max,
                        absl::string_view meaning);

// One integer field and its bounds, for CheckFields.
struct BoundedField {
  const char* name;
  int64_t value, min, max;
  const char* meaning;
};

// CheckRange on each field in order; the first failure.
absl::Status CheckFields(std::initializer_list<BoundedField> fields);

// A finite double in [min, max].
absl::Status CheckFinite(absl::string_view field, double value, double min, double max, absl::string_view meaning);

// kInvalidArgument unless `text` is valid UTF-8 without surrogate code
// points: protobuf refuses to parse a string field that is not, so a plan
// holding one could be written but never read.
absl::Status CheckUtf8(absl::string_view field, absl::string_view text);

// The largest sizes a resolved, field-valid model and run imply -- parameters,
// the logits, the attention scores, all blocks' activations -- within
// kMaxParameters and kMaxDerivedBytes; the message names the product and
// which flag shrinks it.
absl::Status ValidateSizes(const ModelSpec& model, const RunConfig& config);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_LIMITS_H_
