#include "planner/gpu_catalog.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"

namespace zplan {

const std::vector<std::pair<std::string, std::string>>& EmbeddedGpuCatalog();

const GpuCatalog& GetGpuCatalog() {
  static const GpuCatalog* catalog = [] {
    auto* parsed = new GpuCatalog;
    const auto& files = EmbeddedGpuCatalog();
    ZPLAN_CHECK(files.size() == 1);
    // The catalog is compiled in and covered by tests; failing to parse it is a build defect.
    ZPLAN_CHECK(ParseProto(files[0].second, ProtoFormat::kText, files[0].first, parsed).ok());
    return parsed;
  }();
  return *catalog;
}

absl::StatusOr<GpuSpec> FindGpu(absl::string_view key) {
  const std::string wanted = absl::AsciiStrToLower(key);
  std::vector<std::string> keys;
  for (const GpuSpec& gpu : GetGpuCatalog().gpus()) {
    if (gpu.key() == wanted) return gpu;
    keys.push_back(gpu.key());
  }
  return absl::InvalidArgumentError(absl::StrCat("--gpu: unknown GPU \"", key,
                                                 "\"; catalog: ", absl::StrJoin(keys, ", ")));
}

}  // namespace zplan
