#include "planner/plot.h"

#include <cairo.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "planner/model_spec.h"
#include "planner/plan_builder.h"
#include "planner/proto_io.h"

namespace zplan {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// The README's example: 1b, seq 8192, ZeRO-3 on 8 H100s; `budget_gib` > 0
// adds a budget line.
Plan OneBillionZero3(double budget_gib = 0) {
  absl::StatusOr<ModelSpec> model = LoadPreset("1b");
  EXPECT_TRUE(model.ok()) << model.status();
  RunConfig config;
  config.mutable_cluster()->set_gpu("h100-80gb");
  config.mutable_cluster()->set_gpus_per_node(8);
  config.mutable_zero()->set_stage(3);
  config.set_seq_length(8192);
  PlanOptions options;
  options.device_budget_bytes = static_cast<int64_t>(budget_gib * (int64_t{1} << 30));
  absl::StatusOr<Plan> plan = BuildPlan(*model, config, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// A zrun report for rank 0 of a two-step run: step 0 warms up, step 1 is measured.
Report MeasuredReport(const Plan& plan) {
  Report report;
  RankReport* rank = report.add_ranks();
  const int64_t live = plan.device_per_rank().peak_bytes() - plan.device_per_rank().allocator_bytes() -
                       plan.device_per_rank().runtime_bytes();
  rank->mutable_measured_device()->set_peak_bytes(live);
  for (int step : {-1, 1}) {
    for (Phase phase : {PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER_STEP}) {
      PhaseSample* s = rank->add_samples();
      s->set_step(step);
      s->set_phase(phase);
      s->set_allocated_bytes(live / (phase == PHASE_FORWARD ? 2 : 8));
      s->set_peak_allocated_bytes(live);
    }
  }
  return report;
}

TEST(PlotTest, WritesAPngThatReadsBackAtItsSize) {
  const Plan plan = OneBillionZero3(70);
  const Report report = MeasuredReport(plan);
  const std::string path = TempPath("step.png");
  ASSERT_TRUE(WritePlot(path, plan, &report).ok());
  absl::StatusOr<std::string> bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(bytes->size(), 20000u);  // a chart, not a blank canvas
  cairo_surface_t* image = cairo_image_surface_create_from_png(path.c_str());
  ASSERT_EQ(cairo_surface_status(image), CAIRO_STATUS_SUCCESS);
  EXPECT_EQ(cairo_image_surface_get_width(image), 1280);
  EXPECT_EQ(cairo_image_surface_get_height(image), 720);
  cairo_surface_destroy(image);
}

TEST(PlotTest, WritesAnSvgCarryingTheTitleAndThePeak) {
  const Plan plan = OneBillionZero3();
  const std::string path = TempPath("step.SVG");  // the extension in any case
  ASSERT_TRUE(WritePlot(path, plan).ok());
  absl::StatusOr<std::string> svg = ReadFile(path);
  ASSERT_TRUE(svg.ok()) << svg.status();
  // An XML declaration at most, then the <svg> root element.
  size_t start = 0;
  if (svg->rfind("<?xml", 0) == 0) start = svg->find("?>") + 2;
  start = svg->find_first_not_of(" \r\n", start);
  ASSERT_NE(start, std::string::npos);
  EXPECT_EQ(svg->substr(start, 4), "<svg");
  EXPECT_NE(svg->find("</svg>"), std::string::npos);

  const std::string title = PlotTitle(plan);
  EXPECT_EQ(title, "1b · ZeRO-3 · bf16 · micro-batch 1 · seq 8192 · NVIDIA H100 80GB HBM3");
  EXPECT_NE(svg->find("<title>" + title + "</title>"), std::string::npos);
  const std::string peak = PeakLabel(plan);
  EXPECT_EQ(peak, "peak 33.71 GiB at " + plan.device_per_rank().peak_event());
  EXPECT_NE(svg->find("<desc>" + peak + "</desc>"), std::string::npos);
}

TEST(PlotTest, RejectsOtherExtensionsNamingTheFlagAndLeavesTheFileAlone) {
  const Plan plan = OneBillionZero3();
  const std::string path = TempPath("step.jpg");
  ASSERT_TRUE(WriteFileAtomically(path, "a good file").ok());
  for (const std::string& bad : {path, TempPath("step"), TempPath("step.png.txt")}) {
    const absl::Status status = WritePlot(bad, plan);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("--plot"), absl::string_view::npos) << status;
    EXPECT_NE(status.message().find(".png or .svg"), absl::string_view::npos) << status;
  }
  EXPECT_EQ(*ReadFile(path), "a good file");
}

TEST(PlotTest, AnUnwritablePathIsAnErrorNamingTheFlag) {
  const Plan plan = OneBillionZero3();
  const absl::Status missing_dir = WritePlot(TempPath("no/such/dir/step.png"), plan);
  EXPECT_FALSE(missing_dir.ok());
  EXPECT_NE(missing_dir.message().find("--plot: cannot write"), absl::string_view::npos) << missing_dir;
  const std::string directory = TempPath("a_directory.png");
  ASSERT_EQ(mkdir(directory.c_str(), 0755), 0);
  const absl::Status over_directory = WritePlot(directory, plan);
  EXPECT_FALSE(over_directory.ok());
  EXPECT_NE(over_directory.message().find("--plot: "), absl::string_view::npos) << over_directory;
  EXPECT_EQ(ReadFile(directory).status().code(), absl::StatusCode::kInvalidArgument);  // still a directory
}

TEST(PlotTest, APlanWithoutATimelineIsAClearErrorAndLeavesTheFileAlone) {
  Plan plan = OneBillionZero3();
  const std::string path = TempPath("good.png");
  ASSERT_TRUE(WritePlot(path, plan).ok());
  const std::string good = *ReadFile(path);
  plan.clear_timeline();
  const absl::Status status = WritePlot(path, plan);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--plot: the plan has no simulated timeline"), absl::string_view::npos) << status;
  EXPECT_EQ(*ReadFile(path), good);
}

TEST(PlotTest, RejectsATimelineThatFreesMoreThanItHolds) {
  Plan plan = OneBillionZero3();
  MemoryEvent* e = plan.mutable_timeline(0);
  e->set_kind(MemoryEvent::FREE);
  const absl::StatusOr<std::string> image = RenderPlot(plan, nullptr, PlotFormat::kSvg);
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(image.status().message().find("timeline event 0"), absl::string_view::npos) << image.status();
}

TEST(PlotTest, AReportWithoutMeasuredStepsIsRejected) {
  const Plan plan = OneBillionZero3();
  Report report;
  EXPECT_EQ(RenderPlot(plan, &report, PlotFormat::kSvg).status().code(), absl::StatusCode::kInvalidArgument);
  PhaseSample* warmup = report.add_ranks()->add_samples();  // only the sample before step 0
  warmup->set_step(-1);
  warmup->set_phase(PHASE_INIT);
  const absl::Status status = RenderPlot(plan, &report, PlotFormat::kSvg).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--report"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace zplan
