#include "tests/doc_diff.h"

#include "gtest/gtest.h"

namespace zplan {
namespace {

TEST(FirstDifferenceTest, NamesTheFirstDifferingLine) {
  EXPECT_EQ(FirstDifference("a\nb\n", "a\nb\n"), "");
  EXPECT_EQ(FirstDifference("a\nb\n", "a\nc\n"), "line 2:\n  committed: b\n  fresh:     c");
  EXPECT_EQ(FirstDifference("a\n", "a\nb\n"), "line 2:\n  committed: \n  fresh:     b");
}

// Row 28 of docs/accuracy.md as an Intel and an AMD VM measured it: the same
// peak, split differently among gradients, temporaries and activations.
constexpr char kIntel[] =
    "| 28 | 1 | 2.0 MiB | 1.0 MiB (-38.24% of 1.6 MiB) | 953.7 MiB | 4.0 KiB (-99.64% of 1.1 MiB) | 2.1 MiB |\n";
constexpr char kAmd[] =
    "| 28 | 1 | 2.0 MiB | 387.8 KiB (-76.77% of 1.6 MiB) | 953.7 MiB | 1.1 MiB (+1.36% of 1.1 MiB) | 1.6 MiB |\n";

TEST(FirstDifferenceWithinTest, BytesMayMoveByTheFractionOfTheirLine) {
  EXPECT_EQ(FirstDifferenceWithin(kIntel, kAmd, 0.01), "");
  EXPECT_NE(FirstDifferenceWithin(kIntel, kAmd, 0.0001), "");  // 1.1 MiB of about 966 MiB moved
}

TEST(FirstDifferenceWithinTest, TextAroundTheFiguresMustMatch) {
  EXPECT_NE(FirstDifferenceWithin("| 28 | 1 | 2.0 MiB |", "| 29 | 1 | 2.0 MiB |", 0.5), "");
  EXPECT_NE(FirstDifferenceWithin("| 1.0 MiB |", "| 1.0 KiB |", 0.5), "");  // 1 MiB is not 1 KiB
  EXPECT_NE(FirstDifferenceWithin("| 1.0 MiB |", "| 1.0 MiB | 2.0 MiB |", 0.5), "");
  EXPECT_NE(FirstDifferenceWithin("b2 s128", "b2 s256", 0.5), "");  // not byte figures
  // Percentages, and the planned bytes beside one, are derived from the figures.
  EXPECT_EQ(FirstDifferenceWithin("| 12 B (unplanned) | +0.00% |", "| 12 B (unplanned) | -9.50% |", 0), "");
  EXPECT_EQ(FirstDifferenceWithin("| 1.1 MiB (+1.36% of 1.1 MiB) |", "| 1.1 MiB |", 0.1), "");
  EXPECT_NE(FirstDifferenceWithin("a\n", "a\nb\n", 0.5), "");
}

}  // namespace
}  // namespace zplan
