#include "tools/consolidate.h"

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

std::vector<float> Floats(const NamedTensor& t) {
  std::vector<float> out(t.data().size() / 4);
  std::memcpy(out.data(), t.data().data(), out.size() * 4);
  return out;
}

int64_t Numel(const google::protobuf::RepeatedField<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

absl::StatusOr<ConsolidatedState> ConsolidateCheckpoint(const std::string& dir) {
  ZPLAN_ASSIGN_OR_RETURN(std::string latest, ReadFile(dir + "/latest"));
  while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  const std::string step_dir = absl::StrCat(dir, "/", latest);
  ZPLAN_ASSIGN_OR_RETURN(CheckpointShard first, ReadProtoFile<CheckpointShard>(step_dir + "/rank-0.pb"));

  ConsolidatedState state;
  state.set_step(first.step());
  state.set_total_params(first.total_params());
  std::map<std::string, std::pair<NamedTensor*, std::vector<float>>> params;
  std::map<std::string, int64_t> covered;
  for (const OwnedSlice& slice : first.slices()) {
    NamedTensor* t = state.add_params();
    t->set_name(slice.param());
    t->set_dtype("float32");
    *t->mutable_shape() = slice.shape();
    params[slice.param()] = {t, std::vector<float>(static_cast<size_t>(Numel(slice.shape())), 0.0f)};
  }
  for (int rank = 0; rank < first.world_size(); ++rank) {
    CheckpointShard shard;
    if (rank == 0) {
      shard = first;
    } else {
      auto read = ReadProtoFile<CheckpointShard>(absl::StrCat(step_dir, "/rank-", rank, ".pb"));
      if (!read.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(step_dir, ": shard of rank ", rank, " of ",
                                                          first.world_size(), ": ", read.status().message()));
      }
      shard = *std::move(read);
    }
    if (shard.step() != first.step() || shard.world_size() != first.world_size() || shard.stage() != first.stage()) {
      return absl::FailedPreconditionError(absl::StrCat(step_dir, ": rank ", rank, " shard is from another run"));
    }
    const NamedTensor* source = nullptr;
    for (const NamedTensor& t : shard.tensors()) {
      if (t.name() == "master" || (t.name() == "working" && t.dtype() == "float32" && source == nullptr)) source = &t;
    }
    if (source == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(step_dir, ": rank ", rank, " has no fp32 weights"));
    }
    const std::vector<float> values = Floats(*source);
    for (const OwnedSlice& slice : shard.slices()) {
      auto it = params.find(slice.param());
      if (it == params.end()) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " has unknown parameter ", slice.param()));
      }
      for (int64_t i = slice.lo(); i < slice.hi(); ++i) {
        it->second.second[static_cast<size_t>(i)] = values[static_cast<size_t>(slice.dst() + i - slice.lo())];
      }
      covered[slice.param()] += slice.hi() - slice.lo();
    }
    if (first.stage() == 0) break;  // every rank holds everything
  }
  for (auto& [name, entry] : params) {
    const int64_t numel = static_cast<int64_t>(entry.second.size());
    if (covered[name] != numel) {
      return absl::FailedPreconditionError(absl::StrCat(step_dir, ": ", name, " has ", covered[name], " of ", numel,
                                                        " elements in the shards"));
    }
    entry.first->set_data(entry.second.data(), entry.second.size() * 4);
  }
  return state;
}

absl::StatusOr<double> MaxAbsDifference(const ConsolidatedState& a, const ConsolidatedState& b) {
  if (a.params_size() != b.params_size()) return absl::InvalidArgumentError("different parameter counts");
  double worst = 0;
  for (int i = 0; i < a.params_size(); ++i) {
    if (a.params(i).name() != b.params(i).name() || a.params(i).data().size() != b.params(i).data().size()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " differs: ", a.params(i).name(), " vs ",
                                                     b.params(i).name()));
    }
    const std::vector<float> x = Floats(a.params(i)), y = Floats(b.params(i));
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, static_cast<double>(std::fabs(x[j] - y[j])));
  }
  return worst;
}

}  // namespace zplan
