// seed_tables: regenerates docs/seed_tables.md (--out) or prints it.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "planner/proto_io.h"
#include "tools/seed_tables.h"

ABSL_FLAG(std::string, out, "", "write the report here (atomically) instead of stdout");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (const char* dir = std::getenv("BUILD_WORKSPACE_DIRECTORY"); dir != nullptr && chdir(dir) != 0) return 1;
  auto report = zplan::GenerateSeedTables();
  if (!report.ok()) {
    std::cerr << "seed_tables: " << report.status().message() << "\n";
    return 1;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cout << *report;
    return 0;
  }
  const absl::Status status = zplan::WriteFileAtomically(out, *report);
  if (!status.ok()) std::cerr << "seed_tables: " << status.message() << "\n";
  return status.ok() ? 0 : 1;
}
