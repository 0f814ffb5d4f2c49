#include "planner/json.h"

#include <cctype>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "planner/limits.h"

namespace zplan {
namespace {

using google::protobuf::Value;

// protobuf's JSON parser has a recursion budget of 100
// (util/internal/json_stream_parser.cc, kDefaultMaxRecursionDepth) that a
// nested object spends faster than one level each: with protobuf 3.21, 33
// nested objects parse and 34 fail, with a message about something else. So
// the depth is checked here first; real configs nest three or four levels.
constexpr int kMaxJsonDepth = 32;

std::string LineColumn(absl::string_view text, size_t offset) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::StrCat(line, ":", offset - line_start + 1);
}

absl::Status Malformed(absl::string_view source, absl::string_view where, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, where.empty() ? "" : ":", where, ": malformed JSON: ", message));
}

// What protobuf's parser accepts and Python's json.loads refuses. Lexical:
// the grammar itself is protobuf's to check.
absl::Status CheckPythonStrictness(absl::string_view text, absl::string_view source) {
  auto error = [&](size_t offset, absl::string_view message) {
    return Malformed(source, LineColumn(text, offset), message);
  };
  int depth = 0;
  size_t last_comma = absl::string_view::npos;  // a comma with only space after it so far
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if ((c == '}' || c == ']') && last_comma != absl::string_view::npos) {
      return error(last_comma, absl::StrCat("a trailing comma before '", std::string(1, c), "'; remove it"));
    }
    last_comma = c == ',' ? i : absl::string_view::npos;
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (static_cast<unsigned char>(text[i]) < 0x20) {
          return error(i, "a raw control character (a line break or tab) inside a string; escape it (\\n, \\t)");
        }
        if (text[i] != '\\' || ++i == text.size()) continue;
        if (absl::string_view("\"\\/bfnrtu").find(text[i]) == absl::string_view::npos) {
          return error(i - 1, absl::StrCat("an invalid escape in a string: a backslash before ",
                                           QuoteInput(text.substr(i, 1))));
        }
      }
    } else if (c == '\'') {
      return error(i, "a single-quoted string; JSON strings and keys take double quotes");
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return error(i, absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == '-' || absl::ascii_isdigit(c)) {
      for (; i + 1 < text.size() && absl::string_view("0123456789.eE+-").find(text[i + 1]) != absl::string_view::npos;
           ++i) {
        if (text[i + 1] == '.' && (i + 2 == text.size() || !absl::ascii_isdigit(text[i + 2]))) {
          return error(i + 1, "a number ending in '.'; write a digit after it (1.0)");
        }
      }
    } else if (absl::ascii_isalpha(c) || c == '_') {
      size_t end = i;
      while (end < text.size() && (absl::ascii_isalnum(text[end]) || text[end] == '_')) ++end;
      const absl::string_view word = text.substr(i, end - i);
      if (word != "true" && word != "false" && word != "null") {
        return error(i, absl::StrCat("unexpected \"", word,
                                     "\"; keys and strings take double quotes, and JSON has no NaN or Infinity"));
      }
      i = end - 1;
    }
  }
  return absl::OkStatus();
}

// protobuf's message is "reason\n<the input around the error>\n<spaces>^";
// one line instead, with the line and column where the excerpt is unique.
absl::Status FromProtobufError(absl::string_view message, absl::string_view text, absl::string_view source) {
  // "(struct_value.fields[0]) a: Repeated map key: 'a' is already set." (the
  // key itself may hold a line break).
  constexpr absl::string_view kRepeated = "Repeated map key: '";
  if (const size_t repeated = message.find(kRepeated); repeated != absl::string_view::npos) {
    absl::string_view key = message.substr(repeated + kRepeated.size());
    key = key.substr(0, key.rfind("' is already set"));
    return Malformed(source, "",
                     absl::StrCat("the key ", QuoteInput(key), " appears twice in one object; keep one (Python's "
                                  "json would silently use the last)"));
  }
  const size_t reason_end = message.find('\n');
  const size_t caret_start = message.rfind('\n');
  absl::string_view reason = message.substr(0, reason_end);
  absl::ConsumeSuffix(&reason, ".");
  std::string where;
  if (reason_end != absl::string_view::npos && caret_start > reason_end) {
    const absl::string_view excerpt = message.substr(reason_end + 1, caret_start - reason_end - 1);
    const size_t caret = message.find('^', caret_start);
    const size_t at = text.find(excerpt);
    if (caret != absl::string_view::npos && at != absl::string_view::npos &&
        text.find(excerpt, at + 1) == absl::string_view::npos) {
      where = LineColumn(text, at + (caret - caret_start - 1));
    }
  }
  return Malformed(source, where, absl::AsciiStrToLower(reason.substr(0, 1)) + std::string(reason.substr(1)));
}

}  // namespace

absl::StatusOr<Value> ParseJson(absl::string_view text, absl::string_view source) {
  if (absl::StripAsciiWhitespace(text).empty()) return Malformed(source, "", "the file is empty");
  if (absl::Status strict = CheckPythonStrictness(text, source); !strict.ok()) return strict;
  Value value;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), &value);
  if (!status.ok()) {
    return FromProtobufError(absl::string_view(status.message().data(), status.message().size()), text, source);
  }
  return value;
}

const char* JsonTypeName(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNullValue: return "null";
    case Value::kNumberValue: return "number";
    case Value::kStringValue: return "string";
    case Value::kBoolValue: return "boolean";
    case Value::kStructValue: return "object";
    case Value::kListValue: return "array";
    case Value::KIND_NOT_SET: break;
  }
  return "nothing";
}

std::string QuoteInput(absl::string_view text) {
  constexpr size_t kMaxQuotedBytes = 40;
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxQuotedBytes)),
                      text.size() > kMaxQuotedBytes ? "...\"" : "\"");
}

JsonObject::JsonObject(std::shared_ptr<const Value> document, const google::protobuf::Struct* object,
                       std::string source, std::string path, Auto auto_values)
    : document_(std::move(document)),
      object_(object),
      source_(std::move(source)),
      path_(std::move(path)),
      auto_values_(auto_values) {}

absl::StatusOr<JsonObject> ParseJsonObject(absl::string_view text, absl::string_view source,
                                           JsonObject::Auto auto_values) {
  absl::StatusOr<Value> parsed = ParseJson(text, source);
  if (!parsed.ok()) return parsed.status();
  auto document = std::make_shared<const Value>(*std::move(parsed));
  if (!document->has_struct_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object ({...}) at the top level, got ", JsonTypeName(*document)));
  }
  const google::protobuf::Struct* root = &document->struct_value();
  return JsonObject(std::move(document), root, std::string(source), "", auto_values);
}

const Value* JsonObject::Find(absl::string_view key) const {
  auto it = object_->fields().find(std::string(key));
  return it == object_->fields().end() ? nullptr : &it->second;
}

absl::Status JsonObject::Error(absl::string_view key, absl::string_view message) const {
  return absl::InvalidArgumentError(
      absl::StrCat(source_, ": ", path_, path_.empty() ? "" : ".", key, ": ", message));
}

bool JsonObject::IsAuto(absl::string_view key) const {
  const Value* value = Find(key);
  return value != nullptr && value->has_string_value() && value->string_value() == "auto";
}

const Value* JsonObject::Present(absl::string_view key) const {
  const Value* value = Find(key);
  if (value == nullptr || value->has_null_value()) return nullptr;
  if (auto_values_ == Auto::kIsUnset && IsAuto(key)) return nullptr;
  return value;
}

absl::Status JsonObject::WrongType(absl::string_view key, absl::string_view expected) const {
  const Value& value = *Find(key);
  std::string got = JsonTypeName(value);
  if (value.has_number_value()) absl::StrAppend(&got, " ", value.number_value());
  if (value.has_string_value()) absl::StrAppend(&got, " ", QuoteInput(value.string_value()));
  return Error(key, absl::StrCat("expected ", expected, ", got ", got));
}

absl::StatusOr<std::optional<int64_t>> JsonObject::Int(absl::string_view key) const {
  const Value* value = Present(key);
  if (value == nullptr) return std::nullopt;
  const double number = value->number_value();
  if (!value->has_number_value() || number != std::floor(number)) return WrongType(key, "an integer");
  if (std::fabs(number) >= kMaxExactJsonInteger) {
    return Error(key, absl::StrCat(number, " is too large to be a count (2^53 or more)"));
  }
  return static_cast<int64_t>(number);
}

absl::StatusOr<std::optional<double>> JsonObject::Number(absl::string_view key) const {
  const Value* value = Present(key);
  if (value == nullptr) return std::nullopt;
  if (!value->has_number_value()) return WrongType(key, "a number");
  return value->number_value();
}

absl::StatusOr<std::optional<bool>> JsonObject::Bool(absl::string_view key) const {
  const Value* value = Present(key);
  if (value == nullptr) return std::nullopt;
  if (!value->has_bool_value()) return WrongType(key, "true or false");
  return value->bool_value();
}

absl::StatusOr<std::optional<std::string>> JsonObject::String(absl::string_view key) const {
  const Value* value = Present(key);
  if (value == nullptr) return std::nullopt;
  if (!value->has_string_value()) return WrongType(key, "a string");
  return value->string_value();
}

absl::StatusOr<std::optional<JsonObject>> JsonObject::Object(absl::string_view key) const {
  const Value* value = Present(key);
  if (value == nullptr) return std::nullopt;
  if (!value->has_struct_value()) return WrongType(key, "an object");
  return JsonObject(document_, &value->struct_value(), source_, absl::StrCat(path_, path_.empty() ? "" : ".", key),
                    auto_values_);
}

}  // namespace zplan
