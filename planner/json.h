// File: json.h
// The two JSON inputs users hand zplan -- a Hugging Face config.json and a
// DeepSpeed ds_config.json -- parsed by protobuf's json_util into a
// google.protobuf.Value, and read through JsonObject, whose errors name the
// key path: "ds_config.json: zero_optimization.stage: expected an integer,
// got string".
//
// Accepted is what Python's json.loads accepts (transformers and DeepSpeed
// read both files with it), except, on the safe side:
// - a duplicate key is an error (Python silently keeps the last one);
// - NaN and Infinity are errors (no field of either file can use them).
// protobuf's parser alone is more lenient than Python's (trailing commas,
// single quotes, bare keys, "1.", invalid escapes, raw control characters in
// strings); a lexical pre-check refuses those with the line and column.
// Text must be UTF-8; numbers are doubles, so integers beyond 2^53 are
// refused by JsonObject::Int.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(JsonObject root, ParseJsonObject(text, "config.json"));
//   ZPLAN_ASSIGN_OR_RETURN(std::optional<int64_t> hidden, root.Int("hidden_size"));
#ifndef ZPLAN_PLANNER_JSON_H_
#define ZPLAN_PLANNER_JSON_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"

namespace zplan {

// Parses a complete JSON document. kInvalidArgument names `source`, the
// line and column where they are known, and what is wrong.
absl::StatusOr<google::protobuf::Value> ParseJson(absl::string_view text, absl::string_view source);

// "number", "string", "object", ... for error messages.
const char* JsonTypeName(const google::protobuf::Value& value);

// Text from the input, for an error message: in double quotes, escaped (a
// message stays one line) and cut at 40 bytes.
std::string QuoteInput(absl::string_view text);

// One object of a parsed document (which it keeps alive), with typed members.
// Each typed read returns nullopt when the key is absent or null -- and, for
// a ds_config.json, when it is "auto", the placeholder the transformers
// Trainer fills in from its own arguments.
class JsonObject {
 public:
  enum class Auto { kIsError, kIsUnset };

  // The member's value as written, or nullptr.
  const google::protobuf::Value* Find(absl::string_view key) const;
  // "source: path.key: message".
  absl::Status Error(absl::string_view key, absl::string_view message) const;
  bool IsAuto(absl::string_view key) const;

  // An integer (500000000 or 5e8) of magnitude below 2^53.
  absl::StatusOr<std::optional<int64_t>> Int(absl::string_view key) const;
  absl::StatusOr<std::optional<double>> Number(absl::string_view key) const;
  absl::StatusOr<std::optional<bool>> Bool(absl::string_view key) const;
  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const;
  absl::StatusOr<std::optional<JsonObject>> Object(absl::string_view key) const;

 private:
  // The member if it holds a value; nullptr when absent, null or an allowed "auto".
  const google::protobuf::Value* Present(absl::string_view key) const;
  absl::Status WrongType(absl::string_view key, absl::string_view expected) const;

  friend absl::StatusOr<JsonObject> ParseJsonObject(absl::string_view, absl::string_view, Auto);
  JsonObject(std::shared_ptr<const google::protobuf::Value> document, const google::protobuf::Struct* object,
             std::string source, std::string path, Auto auto_values);

  std::shared_ptr<const google::protobuf::Value> document_;
  const google::protobuf::Struct* object_;  // inside *document_
  std::string source_;
  std::string path_;
  Auto auto_values_;
};

// ParseJson, and the top level must be an object.
absl::StatusOr<JsonObject> ParseJsonObject(absl::string_view text, absl::string_view source,
                                           JsonObject::Auto auto_values = JsonObject::Auto::kIsError);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_JSON_H_
