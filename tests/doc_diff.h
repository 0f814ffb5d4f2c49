// File: doc_diff.h
// For tests that keep a generated document in the repository: the first line
// where the committed text and a fresh run differ, for the failure message.
//
// FirstDifference compares exactly. FirstDifferenceWithin is for tables of
// measured bytes that depend on the machine's CPU kernels (which temporaries
// exist at the moment of a peak differs between an AMD and an Intel VM while
// the peak itself does not): the text around the figures must match exactly,
// each byte quantity ("387.8 KiB") may move by a fraction of its line's bytes,
// and percentages, being derived from those quantities, are not compared.
#ifndef ZPLAN_TESTS_DOC_DIFF_H_
#define ZPLAN_TESTS_DOC_DIFF_H_

#include <string>

namespace zplan {

// "" when equal, else "line N:\n  committed: ...\n  fresh:     ...".
std::string FirstDifference(const std::string& committed, const std::string& fresh);

// As FirstDifference, but a byte quantity may differ from the committed one by
// up to `fraction` of the sum of the byte quantities on the fresh line.
std::string FirstDifferenceWithin(const std::string& committed, const std::string& fresh, double fraction);

}  // namespace zplan

#endif  // ZPLAN_TESTS_DOC_DIFF_H_
