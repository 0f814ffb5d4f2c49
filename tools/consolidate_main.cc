// consolidate: zrun checkpoint shards -> one fp32 state file.
//   consolidate CKPT_DIR --out full.pb [--compare other.pb]
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "planner/proto_io.h"
#include "tools/consolidate.h"

ABSL_FLAG(std::string, out, "", "write the consolidated state here (.pb, .textproto or .json)");
ABSL_FLAG(std::string, compare, "", "print the largest difference from this consolidated state");

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "consolidate: give the checkpoint directory, e.g. consolidate ckpt --out full.pb\n";
    return 2;
  }
  auto state = zplan::ConsolidateCheckpoint(args[1]);
  if (!state.ok()) {
    std::cerr << "consolidate: " << state.status().message() << "\n";
    return 2;
  }
  std::cout << "step " << state->step() << ", " << state->params_size() << " tensors, " << state->total_params()
            << " parameters\n";
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    if (absl::Status s = zplan::WriteProtoFile(out, *state); !s.ok()) {
      std::cerr << "consolidate: " << s.message() << "\n";
      return 1;
    }
  }
  if (const std::string other = absl::GetFlag(FLAGS_compare); !other.empty()) {
    auto b = zplan::ReadProtoFile<zplan::ConsolidatedState>(other);
    if (!b.ok()) {
      std::cerr << "consolidate: " << b.status().message() << "\n";
      return 2;
    }
    auto diff = zplan::MaxAbsDifference(*state, *b);
    if (!diff.ok()) {
      std::cerr << "consolidate: " << diff.status().message() << "\n";
      return 2;
    }
    std::cout << "max abs difference " << *diff << "\n";
  }
  return 0;
}
