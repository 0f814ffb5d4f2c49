#include "planner/cli.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, seq_len, "", "tokens per sequence (default 2048)");
ABSL_FLAG(int64_t, steps, 0, "optimizer steps");
ABSL_FLAG(bool, verbose, false, "print more");
ABSL_FLAG(double, timeout, 120, "seconds a peer may take");

namespace zplan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  absl::SetFlag(&FLAGS_seq_len, "");
  absl::SetFlag(&FLAGS_steps, 0);
  absl::SetFlag(&FLAGS_verbose, false);
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data(), __FILE__);
}

TEST(CliTest, ExitCodesByStatus) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), kExitOk);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("--seq")), kExitBadInput);
  EXPECT_EQ(ExitCodeFor(absl::FailedPreconditionError("world")), kExitBadInput);
  EXPECT_EQ(ExitCodeFor(absl::ResourceExhaustedError("does not fit")), kExitBudget);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("rank died")), kExitError);
  EXPECT_EQ(kExitBudget, 3);  // documented in both binaries' --help and README
}

TEST(CliTest, TakesDashesOrUnderscoresWithOrWithoutEquals) {
  auto cl = Parse({"show", "--seq-len=8192", "--steps", "3", "plan.pb", "--verbose"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_seq_len), "8192");
  EXPECT_EQ(absl::GetFlag(FLAGS_steps), 3);
  EXPECT_TRUE(absl::GetFlag(FLAGS_verbose));
  EXPECT_THAT(cl->positional, ::testing::ElementsAre("show", "plan.pb"));
  ASSERT_TRUE(Parse({"--seq_len", "4", "--noverbose", "--", "--steps"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_seq_len), "4");
  EXPECT_FALSE(absl::GetFlag(FLAGS_verbose));
}

// Abseil's own parser printed "ERROR: ..." and exited 1 from inside; every
// usage mistake is now a status naming the flag (exit 2 in both mains).
TEST(CliTest, UsageMistakesAreInvalidArgumentNamingTheFlag) {
  auto unknown = Parse({"--bogus=1"});
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown flag --bogus"));
  auto missing = Parse({"--steps"});
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("--steps needs a value"));
  auto swallowed = Parse({"--seq-len", "--steps=2"});
  EXPECT_THAT(swallowed.status().message(), HasSubstr("--seq-len needs a value"));
  auto bad = Parse({"--steps=many"});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("--steps: \"many\" is not valid"));
  EXPECT_TRUE(absl::IsInvalidArgument(Parse({"--verbose=maybe"}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Parse({"--nosteps"}).status()));
}

TEST(CliTest, HelpListsThisBinarysFlagsWithDefaults) {
  auto cl = Parse({"--help"});
  ASSERT_TRUE(cl.ok());
  EXPECT_TRUE(cl->help);
  const std::string help = FlagsHelp("prog plan.pb", __FILE__);
  EXPECT_THAT(help, HasSubstr("usage: prog plan.pb"));
  EXPECT_THAT(help, HasSubstr("--seq-len"));
  EXPECT_THAT(help, HasSubstr("tokens per sequence (default 2048)\n"));
  EXPECT_THAT(help, HasSubstr("seconds a peer may take (default 120)"));
  EXPECT_THAT(help, Not(HasSubstr("No flags matched")));
  EXPECT_TRUE(Parse({"-h"})->help);
}

TEST(CliTest, VersionNamesTheModelledFrameworks) {
  EXPECT_TRUE(Parse({"--version"})->version);
  EXPECT_THAT(VersionLine("zplan"), HasSubstr("DeepSpeed 0.19.8, transformers 5.23.0"));
}

}  // namespace
}  // namespace zplan
