#include "planner/json.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"

namespace zplan {
namespace {

TEST(JsonTest, ParsesNestedValues) {
  auto v = ParseJson("{\n \"a\": [1, 2.5e3, -3],\n \"b\": {\"c\": \"x\\u0041\\u00e9\"},\n \"d\": null, \"e\": true\n}",
                     "t");
  ASSERT_TRUE(v.ok()) << v.status();
  const auto& fields = v->struct_value().fields();
  EXPECT_EQ(fields.at("a").list_value().values(1).number_value(), 2500);
  EXPECT_EQ(fields.at("b").struct_value().fields().at("c").string_value(), "xA\xc3\xa9");
  EXPECT_TRUE(fields.at("d").has_null_value());
  EXPECT_TRUE(fields.at("e").bool_value());
}

// Each is refused by Python's json.loads, which DeepSpeed and transformers
// read these files with; the message names the place.
TEST(JsonTest, RefusesWhatPythonRefusesWithLineAndColumn) {
  struct Case {
    const char* text;
    const char* where;
    const char* what;
  };
  for (const Case& c : {
           Case{"{\"a\": 1,}", "t.json:1:8:", "trailing comma"},
           Case{"{\n \"a\": [1,\n 2,\n ]}", "t.json:3:3:", "trailing comma"},
           Case{"{'a': 1}", "t.json:1:2:", "single-quoted"},
           Case{"{a: 1}", "t.json:1:2:", "\"a\""},
           Case{"{\"a\": NaN}", "t.json:1:7:", "NaN"},
           Case{"{\"a\": -Infinity}", "t.json:1:8:", "Infinity"},
           Case{"{\"a\": 1.}", "t.json:1:8:", "'.'"},
           Case{"{\"a\": \"x\\q\"}", "t.json:1:9:", "invalid escape in a string: a backslash before \"q\""},
           Case{"{\"a\": \"x\\\n\"}", "t.json:1:9:", "a backslash before \"\\n\""},
           Case{"{\"a\": \"tab\there\"}", "t.json:1:11:", "control character"},
           Case{"{\"a\": 01}", "t.json:1:7:", "octal/hex"},
           Case{"{\"a\": }", "t.json:1:7:", "unexpected token"},
           Case{"{\"a\" 1}", "t.json:1:6:", "expected :"},
           Case{"{\n \"a\": 1\n} x", "t.json:3:3:", "x"},
           Case{"[1, 2", "t.json", "end of string"},
           Case{"{\"a\": \"open", "t.json", "closing quote"},
           Case{"{\"a\": 1e999}", "t.json:1:7:", "range of double"},
           Case{"{\"a\": \"\\ud800\"}", "t.json:1:8:", "low surrogate"},
           Case{"{\"a\": \"\xff\"}", "t.json", "UTF-8"},
           Case{"{\"a\": 1, \"a\": 2}", "t.json", "\"a\" appears twice"},
           Case{"  \n", "t.json", "empty"},
           Case{"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "t.json:1:33:",
                "deeper than 32"},
       }) {
    auto v = ParseJson(c.text, "t.json");
    ASSERT_FALSE(v.ok()) << c.text;
    const std::string message(v.status().message());
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(message.rfind(c.where, 0), 0u) << c.text << " -> " << message;
    EXPECT_NE(absl::AsciiStrToLower(message).find(absl::AsciiStrToLower(c.what)), std::string::npos)
        << c.text << " -> " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(JsonTest, AcceptsWhatPythonAccepts) {
  std::string deepest;  // 32 nested objects, the most ParseJson takes
  for (int i = 0; i < 32; ++i) deepest += "{\"a\": ";
  deepest += "1" + std::string(32, '}');
  for (const std::string& text : std::vector<std::string>{
           "{}", "[]", "5", "{\"\": 1}", "{\"a\": -0, \"b\": 1E5, \"c\": 1.5e-3}",
           "{\"a\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"}", "\t{\"a\" :\r\n[ ]}\n",
           "{\"a\": \"it's, ] } trailing,]\"}", deepest}) {
    EXPECT_TRUE(ParseJson(text, "t").ok()) << text << ": " << ParseJson(text, "t").status();
  }
}

TEST(JsonObjectTest, TypedMembersNameTheKeyPath) {
  auto root = ParseJsonObject(R"({"n": 5e8, "x": 1.5, "s": "three", "o": {"p": {"q": "x"}}, "z": null})", "c.json");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(**root->Int("n"), 500000000);
  EXPECT_EQ(**root->Number("x"), 1.5);
  EXPECT_FALSE(root->Int("missing")->has_value());
  EXPECT_FALSE(root->Int("z")->has_value());
  EXPECT_EQ(root->Int("x").status().message(), "c.json: x: expected an integer, got number 1.5");
  EXPECT_EQ(root->Bool("s").status().message(), "c.json: s: expected true or false, got string \"three\"");
  auto p = (*root->Object("o"))->Object("p");
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_EQ((*p)->Int("q").status().message(), "c.json: o.p.q: expected an integer, got string \"x\"");
  EXPECT_EQ(root->Object("s").status().message(), "c.json: s: expected an object, got string \"three\"");
}

// Input text in a message is escaped, so every error stays one line.
TEST(JsonObjectTest, QuotedInputKeepsMessagesOneLine) {
  auto root = ParseJsonObject(R"({"n": "two\nlines \"and\" more text than forty bytes"})", "c");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(std::string(root->Int("n").status().message()),
            R"(c: n: expected an integer, got string "two\nlines \"and\" more text than forty byt...")");
  auto twice = ParseJson(R"({"a\nb": 1, "a\nb": 2})", "c");
  EXPECT_EQ(std::string(twice.status().message()),
            R"(c: malformed JSON: the key "a\nb" appears twice in one object; keep one (Python's json would )"
            R"(silently use the last))");
}

TEST(JsonObjectTest, IntegersStopBelowTwoToThe53) {
  auto root = ParseJsonObject(R"({"ok": 9007199254740991, "big": 9007199254740993, "neg": -1e300})", "c");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(**root->Int("ok"), 9007199254740991);
  EXPECT_NE(root->Int("big").status().message().find("c: big: "), std::string::npos);
  EXPECT_NE(root->Int("neg").status().message().find("too large"), std::string::npos);
}

TEST(JsonObjectTest, AutoIsUnsetOnlyWhereAllowed) {
  const char* text = R"({"a": "auto", "o": {"b": "auto"}})";
  auto ds = ParseJsonObject(text, "ds", JsonObject::Auto::kIsUnset);
  ASSERT_TRUE(ds.ok());
  EXPECT_TRUE(ds->IsAuto("a"));
  EXPECT_FALSE(ds->Int("a")->has_value());
  EXPECT_FALSE((*ds->Object("o"))->Bool("b")->has_value());
  auto hf = ParseJsonObject(text, "hf");
  EXPECT_EQ(hf->Int("a").status().message(), "hf: a: expected an integer, got string \"auto\"");
}

TEST(JsonObjectTest, TopLevelMustBeAnObject) {
  auto v = ParseJsonObject("[1]", "c.json");
  EXPECT_EQ(std::string(v.status().message()), "c.json: expected a JSON object ({...}) at the top level, got array");
}

}  // namespace
}  // namespace zplan
