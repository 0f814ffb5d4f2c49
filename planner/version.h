// File: version.h
// What zplan is and what it models; printed by --version and stored in every
// plan (Plan.planner_version, Plan.modelled_frameworks).
#ifndef ZPLAN_PLANNER_VERSION_H_
#define ZPLAN_PLANNER_VERSION_H_

namespace zplan {

inline constexpr char kPlannerVersion[] = "zplan 0.1";
// What the planner follows (docs/deepspeed_model.md); the oracle test fails
// when tools/setup.sh installs anything else.
inline constexpr char kModelledFrameworks[] = "DeepSpeed 0.19.8, transformers 5.23.0";

}  // namespace zplan

#endif  // ZPLAN_PLANNER_VERSION_H_
