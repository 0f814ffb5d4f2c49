// File: token_file.h
// zrun's --data: a flat file of little-endian uint16 token ids, as numpy's
// `tofile` writes them (nanoGPT's prepare.py). Free of LibTorch, so the
// fuzzer (tests/fuzz) reads it as zrun does.
//
// A file is accepted when its size is even, it holds at least seq_length + 1
// tokens (a window's inputs and its targets shifted by one) and every id is
// below the model's vocabulary; otherwise kInvalidArgument names --data, what
// is wrong and the fix.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(std::vector<uint16_t> ids, ReadTokenFile(path, vocab, seq));
#ifndef ZPLAN_EXECUTOR_TOKEN_FILE_H_
#define ZPLAN_EXECUTOR_TOKEN_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zplan {

absl::StatusOr<std::vector<uint16_t>> ParseTokens(absl::string_view bytes, int64_t vocab_size, int64_t seq_length,
                                                  absl::string_view path);

absl::StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path, int64_t vocab_size,
                                                    int64_t seq_length);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_TOKEN_FILE_H_
