#include "tools/plan_corpus.h"

#include <cstdlib>
#include <set>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "planner/proto_io.h"
#include "proto/plan.pb.h"
#include "tools/accuracy.h"

namespace zplan {
namespace {

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

int CountPrefix(const std::vector<CorpusCase>& corpus, absl::string_view prefix) {
  int n = 0;
  for (const CorpusCase& c : corpus) n += absl::StartsWith(c.name, prefix);
  return n;
}

TEST(PlanCorpusTest, HoldsBothMatricesSeedsBudgetsAndConfigs) {
  auto corpus = PlanCorpus();
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(CountPrefix(*corpus, "acc-"), static_cast<int>(AccuracyMatrix().size()));
  EXPECT_EQ(CountPrefix(*corpus, "ds-"), static_cast<int>(DeepSpeedMatrix().size()));
  for (const char* seed : {"seed000-base", "seed001-base", "seed002-base", "seed003-base", "seed004-base"}) {
    EXPECT_EQ(CountPrefix(*corpus, seed), 1) << seed;
  }
  EXPECT_GT(CountPrefix(*corpus, "seed"), 10);
  EXPECT_EQ(CountPrefix(*corpus, "budget-"), 2);
  EXPECT_EQ(CountPrefix(*corpus, "zplan-hf-tiny-vit-wide-"), 2);
  EXPECT_EQ(CountPrefix(*corpus, "zplan-hf-llama3-8b-"), 2);
  for (const CorpusCase& c : *corpus) {
    if (!absl::StartsWith(c.name, "ds-")) continue;
    ASSERT_EQ(c.inputs.size(), 1u) << c.name;  // its ds_config, given as --ds-config
    EXPECT_EQ(c.args.back(), "inputs/" + c.inputs[0].first) << c.name;
  }
}

// Two runs of one binary are byte-identical; a changed plan is named, and a
// cleared field no longer counts.
TEST(PlanCorpusTest, WritesAndComparesPlansByteForByte) {
  const std::string a = TempDir("corpus_a"), b = TempDir("corpus_b");
  for (const std::string& dir : {a, b}) {
    auto ran = WriteCorpusPlans("planner/zplan", dir, "budget-");
    ASSERT_TRUE(ran.ok()) << ran.status();
    EXPECT_EQ(*ran, 2);
  }
  EXPECT_FALSE(WriteCorpusPlans("planner/zplan", a, "budget-").ok()) << "a used folder is refused";
  auto same = ComparePlanFolders(a, b, {});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->plans, 2);
  EXPECT_EQ(same->identical_bytes, 2);
  EXPECT_TRUE(same->same()) << FormatComparison(*same);

  const std::string path = b + "/budget-debug-tiny-zero3-bf16.pb";
  auto plan = ReadProtoFile<Plan>(path);
  ASSERT_TRUE(plan.ok()) << plan.status();
  plan->mutable_model()->set_source("changed");
  ASSERT_TRUE(WriteProtoFile(path, *plan).ok());
  auto changed = ComparePlanFolders(a, b, {});
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(changed->same());
  ASSERT_EQ(changed->differing.size(), 1u);
  EXPECT_EQ(changed->differing[0], "budget-debug-tiny-zero3-bf16");
  auto cleared = ComparePlanFolders(a, b, {"model.source"});
  ASSERT_TRUE(cleared.ok());
  EXPECT_TRUE(cleared->same()) << FormatComparison(*cleared);
  EXPECT_EQ(cleared->identical_after_clearing, 1);
  EXPECT_NE(FormatComparison(*cleared).find("identical once model.source were cleared"), std::string::npos);
}

TEST(PlanCorpusTest, ClearFieldPathNamesAMissingField) {
  Plan plan;
  plan.mutable_model()->set_name("x");
  EXPECT_TRUE(ClearFieldPath("model.name", &plan).ok());
  EXPECT_TRUE(plan.model().name().empty());
  const absl::Status status = ClearFieldPath("model.no_such_field", &plan);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("has no field no_such_field"), std::string::npos) << status;
  EXPECT_FALSE(ClearFieldPath("parameters.name", &plan).ok()) << "repeated fields are not paths";
}

}  // namespace
}  // namespace zplan
