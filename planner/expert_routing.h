// File: expert_routing.h
// A mixture of experts' routing (RunConfig.routing, zplan --routing):
// balanced, worst case, or measured per layer (a file, as
// tools/moe_routing.py writes it and the DeepSpeed oracle records it), and
// the pairs each expert takes under it at a plan's token count. Under
// grouped_mm memory follows the pairs, not how they split; the eager experts'
// loop allocates per expert hit (eager_experts.h).
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(ExpertRouting routing, ParseRouting("routing.json"));
//   ZPLAN_RETURN_IF_ERROR(ValidateRouting(routing, spec));
//   std::vector<int64_t> pairs = PairsPerExpert(routing, layer, tokens, experts, top_k);
#ifndef ZPLAN_PLANNER_EXPERT_ROUTING_H_
#define ZPLAN_PLANNER_EXPERT_ROUTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// --routing's value: "balanced", "worst", or the path of a JSON file
// ({"layers": [{"layer": i, "pairs_per_expert": [...]}, ...]}, as
// tools/moe_routing.py writes it and the DeepSpeed oracle records it; a
// "router" name may stand in for "layer": its "layers.<i>." gives the index).
absl::StatusOr<ExpertRouting> ParseRouting(absl::string_view value);
// The file's text; `source` names it in errors.
absl::StatusOr<ExpertRouting> ParseRoutingJson(absl::string_view text, absl::string_view source);

// A measured routing names every MoE layer of `spec` once, each with
// num_experts counts, none negative, some pair in each.
absl::Status ValidateRouting(const ExpertRouting& routing, const ModelSpec& spec);

// The pairs each of `experts` experts takes in `layer` at `tokens` tokens
// and `top_k` experts a token: balanced, worst case, or the layer's
// measured counts scaled to tokens x top_k pairs (largest remainders),
// each at most `tokens` (a token picks an expert once).
std::vector<int64_t> PairsPerExpert(const ExpertRouting& routing, int layer, int64_t tokens, int64_t experts,
                                    int64_t top_k);

// "balanced", "worst case" or "measured (<file>)", for the plan's output.
std::string RoutingName(const ExpertRouting& routing);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_EXPERT_ROUTING_H_
