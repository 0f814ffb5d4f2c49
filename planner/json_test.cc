#include "planner/json.h"

#include "gtest/gtest.h"

namespace zplan {
namespace {

TEST(JsonTest, ParsesNestedValuesWithLines) {
  auto v = ParseJson("{\n \"a\": [1, 2.5e3, -3],\n \"b\": {\"c\": \"x\\u0041\"},\n \"d\": null, \"e\": true\n}", "t");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Find("a")->items()[1].number_value(), 2500);
  EXPECT_EQ(v->Find("a")->line(), 2);
  EXPECT_EQ(v->Find("b")->Find("c")->text(), "xA");
  EXPECT_TRUE(v->Find("d")->is_null());
  EXPECT_TRUE(v->Find("e")->bool_value());
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, KeepsLargeIntegerText) {
  auto v = ParseJson(R"({"n": 8030261248123})", "t");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->Find("n")->text(), "8030261248123");
}

TEST(JsonTest, ReportsLineAndColumn) {
  for (const char* bad : {"{\"a\": }", "[1, 2", "{\"a\" 1}", "{\"a\": 1} x", "\"open", "{'a': 1}"}) {
    auto v = ParseJson(bad, "bad.json");
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("bad.json:1:"), std::string::npos) << v.status();
  }
}

TEST(JsonTest, LastDuplicateKeyWins) {
  auto v = ParseJson(R"({"a": 1, "a": 2})", "t");
  EXPECT_EQ(v->Find("a")->number_value(), 2);
}

}  // namespace
}  // namespace zplan
