#include "executor/token_file.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"

namespace zplan {

absl::StatusOr<std::vector<uint16_t>> ParseTokens(absl::string_view bytes, int64_t vocab_size, int64_t seq_length,
                                                  absl::string_view path) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data ", path, ": the plan's model has no vocabulary; drop --data for synthetic inputs"));
  }
  if (bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--data ", path, ": ", bytes.size(),
                                                   " bytes is not a whole number of uint16 token ids"));
  }
  const int64_t count = static_cast<int64_t>(bytes.size() / 2);
  if (count < seq_length + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data ", path, ": ", count, " tokens, but one sequence of ", seq_length, " needs ", seq_length + 1,
        " (inputs and targets shifted by one); give a longer file or plan a shorter --seq"));
  }
  std::vector<uint16_t> ids(static_cast<size_t>(count));
  std::memcpy(ids.data(), bytes.data(), bytes.size());  // little-endian hosts only (x86-64, aarch64)
  const uint16_t largest = *std::max_element(ids.begin(), ids.end());
  if (largest >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("--data ", path, ": token id ", largest,
                                                   " is outside the model's vocabulary of ", vocab_size));
  }
  return ids;
}

absl::StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path, int64_t vocab_size,
                                                    int64_t seq_length) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--data: ", bytes.status().message()));
  return ParseTokens(*bytes, vocab_size, seq_length, path);
}

}  // namespace zplan
