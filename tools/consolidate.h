// File: consolidate.h
// Turns a zrun checkpoint (one shard per rank, planner/sharding.h layouts
// for any ZeRO stage) into one full-precision state: every parameter whole,
// in fp32, from the ranks' fp32 master slices (or the fp32 working copy when
// a run kept no separate master). Needs no LibTorch.
//
// Rejections: no `latest` marker, a missing or unreadable rank shard, shards
// that disagree (step, world size, stage), elements no shard covers.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(ConsolidatedState state, ConsolidateCheckpoint("ckpt"));
#ifndef ZPLAN_TOOLS_CONSOLIDATE_H_
#define ZPLAN_TOOLS_CONSOLIDATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"

namespace zplan {

absl::StatusOr<ConsolidatedState> ConsolidateCheckpoint(const std::string& dir);

// Largest |a - b| over all parameters; kInvalidArgument if names or shapes differ.
absl::StatusOr<double> MaxAbsDifference(const ConsolidatedState& a, const ConsolidatedState& b);

}  // namespace zplan

#endif  // ZPLAN_TOOLS_CONSOLIDATE_H_
