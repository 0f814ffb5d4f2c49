#include "planner/expert_routing.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "planner/block_layout.h"
#include "planner/json.h"
#include "planner/limits.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

// A count in a routing file: at most one pair per token of the largest micro-batch.
constexpr int64_t kMaxPairsPerExpert = kMaxMicroBatch * kMaxSeqLength;

// The decoder layer's index in a module name ("model.layers.3.mlp.gate"), or -1.
int LayerOfName(absl::string_view name) {
  const size_t at = name.find("layers.");
  if (at == absl::string_view::npos) return -1;
  absl::string_view rest = name.substr(at + 7);
  const size_t dot = rest.find('.');
  int layer = -1;
  if (!absl::SimpleAtoi(rest.substr(0, dot), &layer)) return -1;
  return layer;
}

}  // namespace

absl::StatusOr<ExpertRouting> ParseRouting(absl::string_view value) {
  ExpertRouting routing;
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "balanced") return routing;
  if (v == "worst") {
    routing.set_kind(ExpertRouting::ROUTING_WORST);
    return routing;
  }
  std::ifstream in{std::string(value)};
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--routing: ", value,
                                                   ": no such file; give balanced, worst, or a routing JSON file "
                                                   "(tools/moe_routing.py --json writes one)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  ZPLAN_ASSIGN_OR_RETURN(routing, ParseRoutingJson(text.str(), value));
  routing.set_source(std::string(value));
  return routing;
}

absl::StatusOr<ExpertRouting> ParseRoutingJson(absl::string_view text, absl::string_view source) {
  ZPLAN_ASSIGN_OR_RETURN(JsonObject root, ParseJsonObject(text, source));
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  const google::protobuf::Value* layers = root.Find("layers");
  if (layers == nullptr || !layers->has_list_value() || layers->list_value().values().empty()) {
    return error("layers: expected a non-empty list of {\"layer\": i, \"pairs_per_expert\": [...]}");
  }
  ExpertRouting routing;
  routing.set_kind(ExpertRouting::ROUTING_MEASURED);
  for (int i = 0; i < layers->list_value().values_size(); ++i) {
    const google::protobuf::Value& entry = layers->list_value().values(i);
    const std::string at = absl::StrCat("layers[", i, "]");
    if (!entry.has_struct_value()) return error(absl::StrCat(at, ": expected an object"));
    const auto& fields = entry.struct_value().fields();
    LayerRouting* layer = routing.add_layers();
    auto number = [&](const google::protobuf::Value& v, absl::string_view key, int64_t* out) -> absl::Status {
      if (!v.has_number_value() || v.number_value() != static_cast<double>(static_cast<int64_t>(v.number_value())) ||
          v.number_value() < 0 || v.number_value() > static_cast<double>(kMaxPairsPerExpert)) {
        return error(absl::StrCat(at, ".", key, ": expected a whole number from 0 to ", kMaxPairsPerExpert));
      }
      *out = static_cast<int64_t>(v.number_value());
      return absl::OkStatus();
    };
    if (auto it = fields.find("router"); it != fields.end() && it->second.has_string_value()) {
      layer->set_router(it->second.string_value());
      layer->set_layer(LayerOfName(it->second.string_value()));
    }
    if (auto it = fields.find("layer"); it != fields.end()) {
      int64_t index = 0;
      ZPLAN_RETURN_IF_ERROR(number(it->second, "layer", &index));
      layer->set_layer(static_cast<int>(std::min<int64_t>(index, kMaxLayers)));
    } else if (layer->router().empty() || layer->layer() < 0) {
      return error(absl::StrCat(at, ": needs \"layer\" (the decoder layer's index) or a \"router\" name with "
                                "layers.<i>. in it"));
    }
    auto pairs = fields.find("pairs_per_expert");
    if (pairs == fields.end() || !pairs->second.has_list_value()) {
      return error(absl::StrCat(at, ".pairs_per_expert: expected a list of pairs, one per expert"));
    }
    for (const google::protobuf::Value& v : pairs->second.list_value().values()) {
      int64_t n = 0;
      ZPLAN_RETURN_IF_ERROR(number(v, "pairs_per_expert", &n));
      layer->add_pairs_per_expert(n);
    }
  }
  return routing;
}

absl::Status ValidateRouting(const ExpertRouting& routing, const ModelSpec& spec) {
  if (routing.kind() != ExpertRouting::ROUTING_MEASURED) return absl::OkStatus();
  const std::string source = routing.source().empty() ? "routing" : routing.source();
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (!spec.has_moe()) return error("a routing is for a mixture of experts; this model has none: leave --routing out");
  std::vector<int> seen(spec.num_layers(), 0);
  for (const LayerRouting& l : routing.layers()) {
    if (l.layer() < 0 || l.layer() >= spec.num_layers() || !LayerIsMoe(spec, l.layer())) {
      return error(absl::StrCat("layer ", l.layer(), " is not one of the model's MoE layers (", spec.num_layers(),
                                " layers); was the file measured on another config?"));
    }
    if (seen[l.layer()]++) return error(absl::StrCat("layer ", l.layer(), " is given twice"));
    if (l.pairs_per_expert_size() != spec.moe().num_experts()) {
      return error(absl::StrCat("layer ", l.layer(), ": ", l.pairs_per_expert_size(), " counts, but the model has ",
                                spec.moe().num_experts(), " experts"));
    }
    if (std::accumulate(l.pairs_per_expert().begin(), l.pairs_per_expert().end(), int64_t{0}) == 0) {
      return error(absl::StrCat("layer ", l.layer(), ": no pairs"));
    }
  }
  for (int layer = 0; layer < spec.num_layers(); ++layer) {
    if (LayerIsMoe(spec, layer) && !seen[layer]) {
      return error(absl::StrCat("MoE layer ", layer, " has no routing: the file must give every MoE layer's"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> PairsPerExpert(const ExpertRouting& routing, int layer, int64_t tokens, int64_t experts,
                                    int64_t top_k) {
  const int64_t pairs = tokens * top_k;
  std::vector<int64_t> counts(experts, 0);
  switch (routing.kind()) {
    case ExpertRouting::ROUTING_WORST:
      for (int64_t e = 0; e < std::min(top_k, experts); ++e) counts[e] = tokens;
      return counts;
    case ExpertRouting::ROUTING_MEASURED:
      break;
    default:  // balanced: pair i to expert i mod E
      for (int64_t e = 0; e < experts; ++e) counts[e] = pairs / experts + (e < pairs % experts ? 1 : 0);
      return counts;
  }
  const LayerRouting* measured = nullptr;
  for (const LayerRouting& l : routing.layers()) {
    if (l.layer() == layer) measured = &l;
  }
  if (measured == nullptr || measured->pairs_per_expert_size() != experts) return counts;  // ValidateRouting's
  const int64_t total =
      std::accumulate(measured->pairs_per_expert().begin(), measured->pairs_per_expert().end(), int64_t{0});
  if (total == pairs) {
    counts.assign(measured->pairs_per_expert().begin(), measured->pairs_per_expert().end());
    return counts;
  }
  // Scaled to this plan's pairs: the floors, then the largest remainders,
  // none above one pair per token.
  std::vector<std::pair<double, int64_t>> remainders;
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const double exact = static_cast<double>(measured->pairs_per_expert(e)) * pairs / total;
    counts[e] = std::min<int64_t>(tokens, static_cast<int64_t>(exact));
    given += counts[e];
    remainders.push_back({exact - counts[e], e});
  }
  std::stable_sort(remainders.begin(), remainders.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < pairs && i < remainders.size() * static_cast<size_t>(top_k + 1); ++i) {
    const int64_t e = remainders[i % remainders.size()].second;
    if (counts[e] < tokens) {
      ++counts[e];
      ++given;
    }
  }
  return counts;
}

std::string RoutingName(const ExpertRouting& routing) {
  switch (routing.kind()) {
    case ExpertRouting::ROUTING_WORST: return "worst case (every token on experts 0..k-1)";
    case ExpertRouting::ROUTING_MEASURED: return absl::StrCat("measured (", routing.source(), ")");
    default: return "balanced";
  }
}

}  // namespace zplan
