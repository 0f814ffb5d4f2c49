#include "executor/token_file.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zplan {
namespace {

using ::testing::HasSubstr;

std::string Bytes(const std::vector<uint16_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
}

TEST(TokenFileTest, ReadsLittleEndianIds) {
  auto ids = ParseTokens(Bytes({1, 2, 300, 4}), 512, 3, "t.bin");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ::testing::ElementsAre(1, 2, 300, 4));
}

// A file of exactly `seq` tokens used to reach `% 0` in the trainer (SIGFPE):
// one window needs seq + 1 tokens.
TEST(TokenFileTest, RejectsAFileWithoutOneWholeWindow) {
  auto exact = ParseTokens(Bytes({1, 2, 3, 4}), 512, 4, "t.bin");
  EXPECT_TRUE(absl::IsInvalidArgument(exact.status()));
  EXPECT_THAT(exact.status().message(), HasSubstr("4 tokens, but one sequence of 4 needs 5"));
  EXPECT_TRUE(ParseTokens(Bytes({1, 2, 3, 4, 5}), 512, 4, "t.bin").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ParseTokens("", 512, 1, "t.bin").status()));
}

TEST(TokenFileTest, RejectsOddSizesIdsOutsideTheVocabularyAndMissingFiles) {
  EXPECT_THAT(ParseTokens("abc", 512, 1, "t.bin").status().message(), HasSubstr("3 bytes"));
  EXPECT_THAT(ParseTokens(Bytes({1, 600}), 512, 1, "t.bin").status().message(), HasSubstr("token id 600"));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseTokens(Bytes({1, 2}), 0, 1, "t.bin").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ReadTokenFile("/nonexistent/t.bin", 512, 1).status()));
}

}  // namespace
}  // namespace zplan
