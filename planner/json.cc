#include "planner/json.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace zplan {

const JsonValue* JsonValue::Find(absl::string_view key) const {
  const JsonValue* found = nullptr;
  for (const auto& [name, value] : members_) {
    if (name == key) found = &value;  // last duplicate wins
  }
  return found;
}

const char* JsonValue::TypeName(Type type) {
  switch (type) {
    case Type::kNull: return "null";
    case Type::kBool: return "boolean";
    case Type::kNumber: return "number";
    case Type::kString: return "string";
    case Type::kArray: return "array";
    case Type::kObject: return "object";
  }
  return "value";
}

// Recursive-descent parser over the whole text; tracks line and column.
class JsonParser {
 public:
  JsonParser(absl::string_view text, absl::string_view source) : text_(text), source_(source) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    if (!ParseValue(&value, 0)) return error_;
    SkipSpace();
    if (pos_ != text_.size()) {
      Fail("unexpected text after the JSON value");
      return error_;
    }
    return value;
  }

 private:
  static constexpr int kMaxDepth = 256;

  bool Fail(absl::string_view message) {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') { ++line; column = 1; } else { ++column; }
    }
    error_ = absl::InvalidArgumentError(
        absl::StrCat(source_, ":", line, ":", column, ": malformed JSON: ", message));
    return false;
  }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\n') ++line_;
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool ParseValue(JsonValue* out, int depth) {
    if (depth > kMaxDepth) return Fail("nested too deeply");
    SkipSpace();
    out->line_ = line_;
    if (pos_ >= text_.size()) return Fail("unexpected end of input");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out->type_ = JsonValue::Type::kString;
      return ParseString(&out->text_);
    }
    if (Consume("true")) { out->type_ = JsonValue::Type::kBool; out->bool_ = true; return true; }
    if (Consume("false")) { out->type_ = JsonValue::Type::kBool; return true; }
    if (Consume("null")) return true;
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    return Fail(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  bool ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t begin = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > begin;
    };
    if (!digits()) return Fail("expected digits");
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!digits()) return Fail("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) return Fail("expected exponent digits");
    }
    out->type_ = JsonValue::Type::kNumber;
    out->text_ = std::string(text_.substr(start, pos_ - start));
    out->number_ = std::strtod(out->text_.c_str(), nullptr);
    return true;
  }

  bool ParseString(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (c == '\n') return Fail("unterminated string");
      if (c != '\\') { out->push_back(c); continue; }
      if (pos_ >= text_.size()) break;
      const char e = text_[pos_++];
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          if (pos_ + 4 > text_.size()) return Fail("short \\u escape");
          const unsigned code = std::strtoul(std::string(text_.substr(pos_, 4)).c_str(), nullptr, 16);
          pos_ += 4;
          // Keys and values zplan reads are ASCII; keep others as UTF-8.
          if (code < 0x80) {
            out->push_back(static_cast<char>(code));
          } else if (code < 0x800) {
            out->push_back(static_cast<char>(0xC0 | (code >> 6)));
            out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
          } else {
            out->push_back(static_cast<char>(0xE0 | (code >> 12)));
            out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
          }
          break;
        }
        default: return Fail("bad escape in string");
      }
    }
    return Fail("unterminated string");
  }

  bool ParseArray(JsonValue* out, int depth) {
    out->type_ = JsonValue::Type::kArray;
    ++pos_;
    SkipSpace();
    if (Consume("]")) return true;
    while (true) {
      JsonValue item;
      if (!ParseValue(&item, depth + 1)) return false;
      out->items_.push_back(std::move(item));
      SkipSpace();
      if (Consume("]")) return true;
      if (!Consume(",")) return Fail("expected ',' or ']' in array");
    }
  }

  bool ParseObject(JsonValue* out, int depth) {
    out->type_ = JsonValue::Type::kObject;
    ++pos_;
    SkipSpace();
    if (Consume("}")) return true;
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Fail("expected a quoted key");
      std::string key;
      if (!ParseString(&key)) return false;
      SkipSpace();
      if (!Consume(":")) return Fail(absl::StrCat("expected ':' after key \"", key, "\""));
      JsonValue value;
      if (!ParseValue(&value, depth + 1)) return false;
      out->members_.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (Consume("}")) return true;
      if (!Consume(",")) return Fail("expected ',' or '}' in object");
    }
  }

  absl::string_view text_;
  absl::string_view source_;
  size_t pos_ = 0;
  int line_ = 1;
  absl::Status error_;
};

absl::StatusOr<JsonValue> ParseJson(absl::string_view text, absl::string_view source) {
  return JsonParser(text, source).ParseDocument();
}

}  // namespace zplan
