// File: json.h
// A small JSON reader for the two JSON inputs users hand zplan: a Hugging Face
// config.json and a DeepSpeed ds_config.json.
//
// Every value remembers the line it started on, so errors can say
// "ds_config.json:12: zero_optimization.stage: expected a number". Parse
// errors report line and column. Numbers keep their text, so 64-bit integers
// and "5e8" both convert exactly. Duplicate object keys keep the last value,
// as Python's json module does.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(JsonValue root, ParseJson(text, "config.json"));
//   const JsonValue* hidden = root.Find("hidden_size");
#ifndef ZPLAN_PLANNER_JSON_H_
#define ZPLAN_PLANNER_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zplan {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Type type() const { return type_; }
  int line() const { return line_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_object() const { return type_ == Type::kObject; }

  bool bool_value() const { return bool_; }
  double number_value() const { return number_; }
  const std::string& text() const { return text_; }  // string value, or a number's literal
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }

  // The member named `key` of an object, or nullptr (also for non-objects).
  const JsonValue* Find(absl::string_view key) const;

  // "number", "string", ... for error messages.
  static const char* TypeName(Type type);

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  int line_ = 1;
  bool bool_ = false;
  double number_ = 0;
  std::string text_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// Parses a complete JSON document. kInvalidArgument names `source`, the line
// and column of the first error.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text, absl::string_view source);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_JSON_H_
