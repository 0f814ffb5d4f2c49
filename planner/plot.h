// File: plot.h
// A picture of one rank's training step: what `zplan --plot FILE` draws.
//
// Plan.timeline, the step the planner simulated for rank 0, becomes a stacked
// area chart of live device memory per component (memory.proto's Component)
// over the step's events in order; each event's bytes hold until the next, so
// the x axis counts events, not time. Only what the timeline holds is drawn:
// no event is invented, merged or smoothed.
//   * The runtime outside the caching allocator (CUDA context, NCCL) is a
//     constant band at the bottom. The allocator's cache is known only at the
//     peak (the plan replays it there), so it is a bar at the peak event up to
//     the plan's device peak, which is marked with its value and event.
//   * Horizontal lines: the GPU's capacity (its catalog entry) and the budget
//     when it differs from the capacity (--budget-gib).
//   * The phases the timeline names are labelled along the x axis; the title
//     names the model, ZeRO stage, precision, micro-batch, sequence and GPU;
//     the legend lists each component's bytes at the peak.
// With a zrun Report (proto/report.proto), its rank-0 samples (else its first
// rank's) of the last measured step are drawn over the plan as markers: bytes
// allocated plus the runtime measured outside the allocator, as the stack
// counts them. zrun samples after forward and loss, after backward and after
// the optimizer step, so the markers sit at the ends of the plan's loss,
// backward and optimizer-step phases; the measured peak is a dashed line.
// zrun's sample before step 0 is left out: it has no optimizer state yet.
//
// The format follows the extension, ".png" or ".svg" (any case). Cairo draws
// text as glyph outlines, so an SVG also carries the title and the peak label
// as <title> and <desc>, for search and screen readers.
//
// The image is rendered in memory and written through a temporary file and
// rename(2) (proto_io.h): an error never replaces a good file. Errors name the
// flag: kInvalidArgument for another extension, a plan without a timeline or
// with one that frees more than it holds, a report without samples;
// WriteFileAtomically's code (kPermissionDenied, kDataLoss) for a path that
// cannot be written. The plan and the report are never modified.
//
// Example:
//   ZPLAN_RETURN_IF_ERROR(WritePlot("step.png", plan));
//   ZPLAN_RETURN_IF_ERROR(WritePlot("step.svg", plan, &report));
#ifndef ZPLAN_PLANNER_PLOT_H_
#define ZPLAN_PLANNER_PLOT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"

namespace zplan {

enum class PlotFormat { kPng, kSvg };

// The format `path`'s extension names; kInvalidArgument naming --plot and the
// accepted extensions otherwise.
absl::StatusOr<PlotFormat> PlotFormatForPath(absl::string_view path);

// "1b · ZeRO-3 · bf16 · micro-batch 1 · seq 8192 · NVIDIA H100 80GB HBM3".
std::string PlotTitle(const Plan& plan);

// "peak 33.69 GiB at loss backward, log-softmax gradient" (units.h FormatBytes:
// MiB below a GiB, as everywhere in the picture).
std::string PeakLabel(const Plan& plan);

// What RenderPlot needs of a report, checked before any planning: a rank
// with samples of a measured step (kInvalidArgument naming --report).
absl::Status CheckPlotReport(const Report& report);

// The image's bytes; `report` may be null.
absl::StatusOr<std::string> RenderPlot(const Plan& plan, const Report* report, PlotFormat format);

// Renders and writes `path` atomically; `report` may be null.
absl::Status WritePlot(const std::string& path, const Plan& plan, const Report* report = nullptr);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_PLOT_H_
