// File: doc_diff.h
// For tests that keep a generated document in the repository: the first line
// where the committed text and a fresh run differ, for the failure message.
#ifndef ZPLAN_TESTS_DOC_DIFF_H_
#define ZPLAN_TESTS_DOC_DIFF_H_

#include <string>

namespace zplan {

// "" when equal, else "line N:\n  committed: ...\n  fresh:     ...".
std::string FirstDifference(const std::string& committed, const std::string& fresh);

}  // namespace zplan

#endif  // ZPLAN_TESTS_DOC_DIFF_H_
