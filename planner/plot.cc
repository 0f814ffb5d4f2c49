#include "planner/plot.h"

#include <cairo-svg.h>
#include <cairo.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"
#include "planner/units.h"
#include "planner/version.h"

namespace zplan {
namespace {

// ---------------------------------------------------------------------------
// What is drawn: the timeline as bands, phases, the peak, zrun's samples.

// Image and plot area, in pixels (PNG) or points (SVG).
constexpr double kWidth = 1280, kHeight = 720;
constexpr double kLeft = 78, kRight = kWidth - 282, kTop = 80, kBottom = kHeight - 104;
constexpr double kLegendLeft = kRight + 26, kLegendRight = kWidth - 18;
constexpr char kFont[] = "DejaVu Sans";

struct Rgb {
  double r, g, b;
};
constexpr Rgb Hex(unsigned v) { return {((v >> 16) & 255) / 255.0, ((v >> 8) & 255) / 255.0, (v & 255) / 255.0}; }

// One band per component, bottom to top: resident states first, what comes and
// goes in a step above them. Colours: Tableau 10, distinct in print and for
// the common colour-vision deficiencies.
struct Band {
  Component component;
  const char* name;
  Rgb colour;
};
constexpr Band kBands[] = {
    {COMPONENT_RUNTIME, "runtime (CUDA, NCCL)", Hex(0xBAB0AC)},
    {COMPONENT_PARAMS, "params", Hex(0x4E79A7)},
    {COMPONENT_GRADS, "grads", Hex(0xF28E2B)},
    {COMPONENT_MASTER_PARAMS, "master params (fp32)", Hex(0x59A14F)},
    {COMPONENT_OPTIMIZER_STATES, "optimizer states", Hex(0xE15759)},
    {COMPONENT_BUFFERS, "buffers", Hex(0x76B7B2)},
    {COMPONENT_ACTIVATIONS, "activations", Hex(0xB07AA1)},
    {COMPONENT_LOGITS, "logits and loss", Hex(0xEDC948)},
    {COMPONENT_TEMPORARIES, "temporaries", Hex(0xFF9DA7)},
    {COMPONENT_ALLOCATOR, "allocator", Hex(0x79706E)},
    {COMPONENT_UNSPECIFIED, "unattributed", Hex(0x9C755F)},
};
constexpr int kNumBands = sizeof(kBands) / sizeof(kBands[0]);
constexpr Rgb kCacheColour = Hex(0x555555);
constexpr Rgb kCapacityColour = Hex(0xB2182B);
constexpr Rgb kBudgetColour = Hex(0xE08214);
constexpr Rgb kMeasuredColour = Hex(0x111111);
constexpr Rgb kText = Hex(0x222222), kMutedText = Hex(0x666666), kGrid = Hex(0xDDDDDD);

// A run of consecutive events of one phase: [begin, end).
struct PhaseRun {
  Phase phase;
  int begin, end;
};

// A zrun sample placed on the plan's x axis.
struct MeasuredPoint {
  double event;   // x, in events
  int64_t bytes;  // allocated + runtime outside the allocator
};

struct Picture {
  int events = 0;
  std::vector<std::array<int64_t, kNumBands>> live;  // per event, bytes per band after it
  std::vector<int64_t> top;                          // per event, the stack's height
  std::vector<bool> drawn;                           // per band: ever non-zero
  std::vector<PhaseRun> phases;
  int peak_event = 0;
  int64_t peak_bytes = 0;      // the plan's device peak (>= the stack there)
  int64_t capacity_bytes = 0;  // 0: none (CPU ranks)
  int64_t budget_bytes = 0;    // 0: the capacity, not drawn apart
  std::vector<MeasuredPoint> measured;
  int measured_rank = -1;  // -1: no report
  int64_t measured_peak_bytes = 0;
};

std::string PhaseName(Phase phase) {
  if (phase == PHASE_UNSPECIFIED) return "(no phase)";
  std::string name = absl::AsciiStrToLower(Phase_Name(phase));
  if (absl::StartsWith(name, "phase_")) name = name.substr(6);
  return absl::StrReplaceAll(name, {{"_", " "}});
}

int BandIndex(Component component) {
  for (int i = 0; i < kNumBands; ++i) {
    if (kBands[i].component == component) return i;
  }
  return kNumBands - 1;  // a Component newer than this table: unattributed
}

// The end of the last run of `phase`, in events; nullopt when the plan has none.
std::optional<int> PhaseEnd(const std::vector<PhaseRun>& runs, Phase phase) {
  std::optional<int> end;
  for (const PhaseRun& run : runs) {
    if (run.phase == phase) end = run.end;
  }
  return end;
}

// The rank drawn: rank 0, whose step the timeline is, else the first.
const RankReport& DrawnRank(const Report& report) {
  for (const RankReport& r : report.ranks()) {
    if (r.rank() == 0) return r;
  }
  return report.ranks(0);
}

// The last step zrun measured (-1: none; step 0 warms up and is not sampled).
int LastMeasuredStep(const RankReport& rank) {
  int last_step = -1;
  for (const PhaseSample& s : rank.samples()) last_step = std::max(last_step, s.step());
  return last_step;
}

absl::Status AddMeasured(const Report& report, Picture* p) {
  ZPLAN_RETURN_IF_ERROR(CheckPlotReport(report));
  const RankReport* rank = &DrawnRank(report);
  const int last_step = LastMeasuredStep(*rank);
  // zrun's phase -> where in the plan's step it samples (plot.h).
  const std::pair<Phase, Phase> kAt[] = {
      {PHASE_FORWARD, PHASE_LOSS}, {PHASE_BACKWARD, PHASE_BACKWARD}, {PHASE_OPTIMIZER_STEP, PHASE_OPTIMIZER_STEP}};
  const int64_t runtime = rank->measured_device().runtime_bytes();
  int64_t peak_allocated = rank->measured_device().peak_bytes();
  for (const PhaseSample& s : rank->samples()) {
    if (s.step() >= 0) peak_allocated = std::max(peak_allocated, s.peak_allocated_bytes());
  }
  for (const auto& [sampled, at] : kAt) {
    const PhaseSample* last = nullptr;  // with accumulation, the last micro-step's, as the timeline
    for (const PhaseSample& s : rank->samples()) {
      if (s.step() == last_step && s.phase() == sampled) last = &s;
    }
    std::optional<int> end = PhaseEnd(p->phases, at);
    if (!end && at == PHASE_LOSS) end = PhaseEnd(p->phases, PHASE_FORWARD);
    if (last != nullptr && end) p->measured.push_back({static_cast<double>(*end), last->allocated_bytes() + runtime});
  }
  if (p->measured.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--report: rank ", rank->rank(), " has no forward, backward or step sample in step ", last_step));
  }
  p->measured_rank = rank->rank();
  p->measured_peak_bytes = peak_allocated + runtime;
  return absl::OkStatus();
}

absl::StatusOr<Picture> BuildPicture(const Plan& plan, const Report* report) {
  if (plan.timeline().empty()) {
    return absl::InvalidArgumentError(
        "--plot: the plan has no simulated timeline to draw (plans zplan writes with --out have one)");
  }
  Picture p;
  p.events = plan.timeline_size();
  const MemoryBreakdown& device = plan.device_per_rank();
  std::array<int64_t, kNumBands> live{};
  live[BandIndex(COMPONENT_RUNTIME)] = device.runtime_bytes();  // constant through the step
  p.drawn.assign(kNumBands, false);
  for (int i = 0; i < p.events; ++i) {
    const MemoryEvent& e = plan.timeline(i);
    int64_t& bytes = live[BandIndex(e.component())];
    bytes += e.kind() == MemoryEvent::FREE ? -e.bytes() : e.bytes();
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--plot: timeline event ", i, " (\"", e.tensor(),
                                                     "\") frees more ", Component_Name(e.component()),
                                                     " than is live"));
    }
    p.live.push_back(live);
    int64_t top = 0;
    for (int b = 0; b < kNumBands; ++b) {
      top += live[b];
      p.drawn[b] = p.drawn[b] || live[b] > 0;
    }
    p.top.push_back(top);
    if (top > p.top[p.peak_event]) p.peak_event = i;
    if (p.phases.empty() || p.phases.back().phase != e.phase()) p.phases.push_back({e.phase(), i, i});
    p.phases.back().end = i + 1;
  }
  p.peak_bytes = std::max(device.peak_bytes(), p.top[p.peak_event]);
  p.capacity_bytes = plan.gpu().capacity_bytes();
  const int64_t budget = plan.budget().device_bytes_per_rank();
  if (budget > 0 && budget != p.capacity_bytes) p.budget_bytes = budget;
  if (report != nullptr) ZPLAN_RETURN_IF_ERROR(AddMeasured(*report, &p));
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public text.

absl::StatusOr<PlotFormat> PlotFormatForPath(absl::string_view path) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".png")) return PlotFormat::kPng;
  if (absl::EndsWith(lower, ".svg")) return PlotFormat::kSvg;
  return absl::InvalidArgumentError(
      absl::StrCat("--plot: \"", path, "\" names no image format; give a path ending in .png or .svg"));
}

absl::Status CheckPlotReport(const Report& report) {
  if (report.ranks().empty()) return absl::InvalidArgumentError("--report: the report has no ranks");
  const RankReport& rank = DrawnRank(report);
  if (LastMeasuredStep(rank) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--report: rank ", rank.rank(), " has no samples of a measured step (zrun --steps 2 or more)"));
  }
  return absl::OkStatus();
}

std::string PlotTitle(const Plan& plan) {
  const RunConfig& c = plan.config();
  const char* precision = c.precision() == PRECISION_FP32 ? "fp32" : c.precision() == PRECISION_FP16 ? "fp16" : "bf16";
  return absl::StrCat(plan.model().name(), " · ZeRO-", c.zero().stage(), " · ", precision, " · micro-batch ",
                      c.micro_batch_size(), " · seq ", c.seq_length(), " · ", plan.gpu().name());
}

std::string PeakLabel(const Plan& plan) {
  const MemoryBreakdown& device = plan.device_per_rank();
  // The timeline's largest moment stands in for a breakdown without one.
  int64_t live = -1;
  std::string event;
  for (const MemoryEvent& e : plan.timeline()) {
    if (e.live_bytes() > live) live = e.live_bytes(), event = e.tensor();
  }
  const int64_t peak = std::max(device.peak_bytes(), live + device.runtime_bytes());
  return absl::StrCat("peak ", FormatBytes(peak), " at ", device.peak_event().empty() ? event : device.peak_event());
}

namespace {

// ---------------------------------------------------------------------------
// Drawing.

class Canvas {
 public:
  explicit Canvas(cairo_t* cr) : cr_(cr) {}
  cairo_t* cr() const { return cr_; }

  void Colour(Rgb c, double alpha = 1) { cairo_set_source_rgba(cr_, c.r, c.g, c.b, alpha); }
  void Font(double size, bool bold = false) {
    cairo_select_font_face(cr_, kFont, CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr_, size);
  }
  double Width(const std::string& text) const {
    cairo_text_extents_t extents;
    cairo_text_extents(cr_, text.c_str(), &extents);
    return extents.x_advance;
  }
  // Baseline at y; align 0 = left, 0.5 = centred, 1 = right.
  void Text(const std::string& text, double x, double y, double align = 0) {
    cairo_move_to(cr_, x - align * Width(text), y);
    cairo_show_text(cr_, text.c_str());
  }
  void Line(double x0, double y0, double x1, double y1, double width, double dash = 0) {
    cairo_set_line_width(cr_, width);
    if (dash > 0) {
      const double pattern[] = {dash, dash * 0.7};
      cairo_set_dash(cr_, pattern, 2, 0);
    }
    cairo_move_to(cr_, x0, y0);
    cairo_line_to(cr_, x1, y1);
    cairo_stroke(cr_);
    cairo_set_dash(cr_, nullptr, 0, 0);
  }
  void Fill(double x, double y, double w, double h) {
    cairo_rectangle(cr_, x, y, w, h);
    cairo_fill(cr_);
  }
  void Circle(double x, double y, double radius, Rgb fill, Rgb stroke) {
    cairo_new_sub_path(cr_);
    cairo_arc(cr_, x, y, radius, 0, 2 * M_PI);
    Colour(fill);
    cairo_fill_preserve(cr_);
    Colour(stroke);
    cairo_set_line_width(cr_, 1.6);
    cairo_stroke(cr_);
  }

 private:
  cairo_t* cr_;
};

// 1, 2, 2.5 or 5 x 10^k: the smallest at least `raw`.
double NiceStep(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0}) {
    if (m * magnitude >= raw * (1 - 1e-9)) return m * magnitude;
  }
  return 10 * magnitude;
}

// "40", "2.5", "0.25": no trailing zeros.
std::string TickLabel(double value) {
  std::string text = absl::StrFormat("%.3f", value);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

struct Box {
  double x0, y0, x1, y1;
  bool Overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
};

class Chart {
 public:
  Chart(const Plan& plan, const Picture& p, cairo_t* cr) : plan_(plan), p_(p), c_(cr) {
    int64_t highest = std::max({p.peak_bytes, p.capacity_bytes, p.budget_bytes, p.measured_peak_bytes});
    for (const MeasuredPoint& m : p.measured) highest = std::max(highest, m.bytes);
    // Some headroom for the labels, then the finest nice step that needs at most 10 ticks.
    const double top_gib = std::max(ToGiB(highest) * 1.06, 1.0 / 1024);
    y_step_gib_ = NiceStep(top_gib / 10);
    y_max_gib_ = std::ceil(top_gib / y_step_gib_ - 1e-9) * y_step_gib_;
  }

  void Draw() {
    c_.Colour(Hex(0xFFFFFF));
    c_.Fill(0, 0, kWidth, kHeight);
    Title();
    Phases();
    YAxis();
    Bands();
    Limits();
    Measured();
    Peak();
    XAxis();
    Legend();
  }

 private:
  double X(double event) const { return kLeft + (kRight - kLeft) * event / p_.events; }
  double Y(int64_t bytes) const { return kBottom - (kBottom - kTop) * ToGiB(bytes) / y_max_gib_; }

  void Title() {
    const RunConfig& config = plan_.config();
    const ClusterSpec& cluster = config.cluster();
    const ZeroConfig& zero = config.zero();
    const char* offload = zero.offload_param() == OFFLOAD_CPU       ? "optimizer+params"
                          : zero.offload_optimizer() == OFFLOAD_CPU ? "optimizer"
                                                                    : "none";
    std::string checkpointing = config.activation_checkpointing() ? ", activation checkpointing" : "";
    c_.Colour(kText);
    c_.Font(19, true);
    c_.Text(PlotTitle(plan_), kLeft, 34);
    c_.Colour(kMutedText);
    c_.Font(12.5);
    const int64_t nodes = cluster.num_nodes(), per_node = cluster.gpus_per_node();
    c_.Text(absl::StrFormat("rank 0 of %d (%d node%s x %d), offload %s, grad-accum %d%s: live device memory per "
                            "component over one simulated training step",
                            nodes * per_node, nodes, nodes == 1 ? "" : "s", per_node, offload,
                            config.gradient_accumulation_steps(), checkpointing),
            kLeft, 57);
    c_.Font(11);
    c_.Text(kPlannerVersion, kWidth - 18, 34, 1);
  }

  // Faint alternate shading per phase run and a dashed line between runs;
  // the names go under the axis (XAxis).
  void Phases() {
    for (size_t i = 0; i < p_.phases.size(); ++i) {
      const PhaseRun& run = p_.phases[i];
      if (i % 2 == 1) {
        c_.Colour(Hex(0xF6F6F6));
        c_.Fill(X(run.begin), kTop, X(run.end) - X(run.begin), kBottom - kTop);
      }
      if (i > 0) {
        c_.Colour(Hex(0xAAAAAA));
        c_.Line(X(run.begin), kTop, X(run.begin), kBottom, 0.8, 4);
      }
    }
  }

  void YAxis() {
    c_.Font(11);
    for (double gib = 0; gib <= y_max_gib_ * (1 + 1e-9); gib += y_step_gib_) {
      const double y = kBottom - (kBottom - kTop) * gib / y_max_gib_;
      c_.Colour(kGrid);
      c_.Line(kLeft, y, kRight, y, 0.8);
      c_.Colour(kText);
      c_.Line(kLeft - 5, y, kLeft, y, 1);
      c_.Text(TickLabel(gib), kLeft - 9, y + 4, 1);
    }
    cairo_save(c_.cr());
    cairo_translate(c_.cr(), 24, (kTop + kBottom) / 2);
    cairo_rotate(c_.cr(), -M_PI / 2);
    c_.Font(12.5);
    c_.Text("device memory per rank (GiB)", 0, 0, 0.5);
    cairo_restore(c_.cr());
  }

  // Each band as a step function: the bytes after event i hold over [i, i+1).
  void Bands() {
    cairo_t* cr = c_.cr();
    std::vector<int64_t> lower(p_.events, 0);
    for (int b = 0; b < kNumBands; ++b) {
      if (!p_.drawn[b]) continue;
      cairo_move_to(cr, X(0), Y(lower[0] + p_.live[0][b]));
      for (int i = 0; i < p_.events; ++i) {
        const double y = Y(lower[i] + p_.live[i][b]);
        cairo_line_to(cr, X(i), y);
        cairo_line_to(cr, X(i + 1), y);
      }
      for (int i = p_.events - 1; i >= 0; --i) {
        cairo_line_to(cr, X(i + 1), Y(lower[i]));
        cairo_line_to(cr, X(i), Y(lower[i]));
      }
      cairo_close_path(cr);
      c_.Colour(kBands[b].colour);
      cairo_fill(cr);
      for (int i = 0; i < p_.events; ++i) lower[i] += p_.live[i][b];
    }
    c_.Colour(kText);
    c_.Line(kLeft, kBottom, kRight, kBottom, 1);
    c_.Line(kLeft, kTop, kLeft, kBottom, 1);
  }

  // Capacity and budget, labelled at the right end above the line; a budget
  // too close to the capacity for two labels puts its own at the left, below.
  void Limits() {
    c_.Font(11.5, true);
    if (p_.capacity_bytes > 0) {
      const double y = Y(p_.capacity_bytes);
      c_.Colour(kCapacityColour);
      c_.Line(kLeft, y, kRight, y, 1.6);
      const std::string label = absl::StrCat("capacity ", FormatBytes(p_.capacity_bytes));
      c_.Text(label, kRight - 6, y - 5, 1);
      avoid_.push_back({kRight - 6 - c_.Width(label), y - 18, kRight, y + 3});
    }
    if (p_.budget_bytes > 0) {
      const double y = Y(p_.budget_bytes);
      c_.Colour(kBudgetColour);
      c_.Line(kLeft, y, kRight, y, 1.6, 7);
      const bool crowded = p_.capacity_bytes > 0 && std::fabs(y - Y(p_.capacity_bytes)) < 18;
      const std::string label = absl::StrCat("budget ", FormatBytes(p_.budget_bytes));
      const double x = crowded ? kLeft + 6 : kRight - 6, baseline = crowded ? y + 15 : y - 5;
      c_.Text(label, x, baseline, crowded ? 0 : 1);
      const double x0 = crowded ? x : x - c_.Width(label);
      avoid_.push_back({x0, baseline - 13, x0 + c_.Width(label), baseline + 3});
    }
  }

  void Measured() {
    if (p_.measured.empty()) return;
    const double y = Y(p_.measured_peak_bytes);
    c_.Colour(kMeasuredColour);
    c_.Line(kLeft, y, kRight, y, 1.2, 3);
    c_.Font(11.5);
    const std::string label = absl::StrCat("zrun peak ", FormatBytes(p_.measured_peak_bytes));
    c_.Text(label, kLeft + 6, y - 5);
    avoid_.push_back({kLeft + 6, y - 18, kLeft + 6 + c_.Width(label), y + 3});
    // Markers only: a line between samples would draw what was not measured.
    for (const MeasuredPoint& m : p_.measured) c_.Circle(X(m.event), Y(m.bytes), 4.5, Hex(0xFFFFFF), kMeasuredColour);
  }

  // The allocator's cache as a bar on top of the stack at the peak event,
  // the peak as a dot, and its label above the data where nothing else is.
  void Peak() {
    const int i = p_.peak_event;
    const double cx = (X(i) + X(i + 1)) / 2, bar = std::max(X(i + 1) - X(i), 5.0);
    const double stack_y = Y(p_.top[i]), peak_y = Y(p_.peak_bytes);
    if (p_.peak_bytes > p_.top[i]) {
      c_.Colour(kCacheColour, 0.9);
      c_.Fill(cx - bar / 2, peak_y, bar, stack_y - peak_y);
    }
    c_.Circle(cx, peak_y, 4, kMeasuredColour, kMeasuredColour);

    const std::string line1 = absl::StrCat("peak ", FormatBytes(p_.peak_bytes));
    const std::string label = PeakLabel(plan_);
    const std::string line2 = label.substr(label.find(" at ") + 1);
    c_.Font(12.5, true);
    double w = c_.Width(line1);
    c_.Font(11.5);
    w = std::max(w, c_.Width(line2)) + 16;
    const double h = 40;
    // Candidates: right of the peak, then left, each just above the data it
    // covers and, failing that, above each horizontal line's label.
    std::optional<Box> chosen;
    for (double x0 : {cx + 12, cx - 12 - w, cx - w / 2}) {
      x0 = std::clamp(x0, kLeft + 4, kRight - 4 - w);
      const int first = std::max(0, static_cast<int>(std::floor((x0 - kLeft) / (kRight - kLeft) * p_.events)));
      const int last =
          std::min(p_.events - 1, static_cast<int>(std::ceil((x0 + w - kLeft) / (kRight - kLeft) * p_.events)));
      int64_t data = 0;
      for (int e = first; e <= last; ++e) data = std::max(data, p_.top[e]);
      for (const MeasuredPoint& m : p_.measured) {
        if (X(m.event) + 6 >= x0 && X(m.event) - 6 <= x0 + w) data = std::max(data, m.bytes);
      }
      // Beside the dot when it is beside it, above it when over it.
      const double bottom = std::min(Y(data) - 10, x0 <= cx && cx <= x0 + w ? peak_y - 10 : peak_y + h / 2);
      std::vector<double> bottoms = {bottom};
      for (const Box& a : avoid_) bottoms.push_back(std::min(bottom, a.y0 - 4));
      for (double b : bottoms) {
        const Box box{x0, b - h, x0 + w, b};
        if (box.y0 < kTop + 2) continue;
        if (std::none_of(avoid_.begin(), avoid_.end(), [&](const Box& a) { return a.Overlaps(box); })) {
          chosen = box;
          break;
        }
      }
      if (chosen) break;
    }
    const Box box = chosen.value_or(Box{std::clamp(cx + 12, kLeft + 4, kRight - 4 - w), kTop + 2, 0, 0});
    const double x0 = box.x0, y0 = box.y0;
    c_.Colour(kMeasuredColour, 0.6);
    c_.Line(cx, peak_y, std::clamp(cx, x0, x0 + w), y0 + h, 0.8);
    c_.Colour(Hex(0xFFFFFF), 0.92);
    c_.Fill(x0, y0, w, h);
    c_.Colour(kMeasuredColour);
    cairo_set_line_width(c_.cr(), 0.8);
    cairo_rectangle(c_.cr(), x0, y0, w, h);
    cairo_stroke(c_.cr());
    c_.Font(12.5, true);
    c_.Text(line1, x0 + 8, y0 + 16);
    c_.Font(11.5);
    c_.Text(line2, x0 + 8, y0 + 32);
  }

  // Event ticks, then the phase names in up to three rows so that short
  // phases (init, loss, optimizer step) stay readable beside long ones.
  void XAxis() {
    c_.Font(10.5);
    c_.Colour(kMutedText);
    const int step = std::max(1, static_cast<int>(NiceStep(p_.events / 10.0)));
    for (int e = 0; e <= p_.events; e += step) {
      c_.Line(X(e), kBottom, X(e), kBottom + 4, 1);
      c_.Text(absl::StrCat(e), X(e), kBottom + 15, 0.5);
    }
    c_.Font(12, true);
    std::array<double, 3> row_end;
    row_end.fill(-1e9);
    for (const PhaseRun& run : p_.phases) {
      const std::string name = PhaseName(run.phase);
      const double w = c_.Width(name), mid = X((run.begin + run.end) / 2.0);
      const double x0 = std::clamp(mid - w / 2, kLeft, kRight - w);
      int row = 0;
      while (row < 2 && x0 < row_end[row] + 8) ++row;
      row_end[row] = x0 + w;
      const double baseline = kBottom + 36 + 16 * row;
      c_.Colour(kMutedText, 0.8);
      c_.Line(X(run.begin), kBottom + 20, X(run.begin), kBottom + 24, 1);
      c_.Line(X(run.begin), kBottom + 22, X(run.end), kBottom + 22, 1);
      c_.Line(X(run.end), kBottom + 20, X(run.end), kBottom + 24, 1);
      if (row > 0) c_.Line(mid, kBottom + 22, mid, baseline - 11, 0.7);
      c_.Colour(kText);
      c_.Text(name, x0, baseline);
    }
    c_.Font(12.5);
    c_.Colour(kText);
    c_.Text(
        absl::StrCat("events of the simulated step, in order (", p_.events, "; each one's bytes hold until the next)"),
        (kLeft + kRight) / 2, kBottom + 88, 0.5);
  }

  void Legend() {
    const double x = kLegendLeft, right = kLegendRight;
    double y = kTop + 4;
    c_.Colour(kText);
    c_.Font(12.5, true);
    c_.Text("at the peak", x, y);
    y += 20;
    const std::array<int64_t, kNumBands>& at_peak = p_.live[p_.peak_event];
    auto entry = [&](const std::string& name, const std::string& value, auto swatch) {
      swatch(y - 9);
      c_.Colour(kText);
      c_.Font(12);
      c_.Text(name, x + 24, y);
      c_.Text(value, right, y, 1);
      y += 19;
    };
    auto square = [&](Rgb colour) {
      return [this, colour, x](double top) {
        c_.Colour(colour);
        c_.Fill(x, top, 16, 11);
      };
    };
    for (int b = kNumBands - 1; b >= 0; --b) {
      if (p_.drawn[b]) entry(kBands[b].name, FormatBytes(at_peak[b]), square(kBands[b].colour));
    }
    const int64_t cache = p_.peak_bytes - p_.top[p_.peak_event];
    if (cache > 0) entry("allocator cache", FormatBytes(cache), square(kCacheColour));
    c_.Colour(kMutedText);
    c_.Line(x, y - 10, right, y - 10, 0.8);
    y += 4;
    c_.Font(12, true);
    c_.Colour(kText);
    c_.Text("total", x + 24, y);
    c_.Text(FormatBytes(p_.peak_bytes), right, y, 1);
    c_.Circle(x + 8, y - 4, 4, kMeasuredColour, kMeasuredColour);
    y += 30;
    auto line = [&](Rgb colour, double dash) {
      return [this, colour, dash, x](double top) {
        c_.Colour(colour);
        c_.Line(x, top + 5, x + 16, top + 5, 1.6, dash);
      };
    };
    if (p_.capacity_bytes > 0) entry("capacity", FormatBytes(p_.capacity_bytes), line(kCapacityColour, 0));
    if (p_.budget_bytes > 0) entry("budget", FormatBytes(p_.budget_bytes), line(kBudgetColour, 4));
    if (p_.measured_rank >= 0) {
      entry(absl::StrCat("zrun, rank ", p_.measured_rank), "",
            [this, x](double top) { c_.Circle(x + 8, top + 5, 4.5, Hex(0xFFFFFF), kMeasuredColour); });
      c_.Font(10.5);
      c_.Colour(kMutedText);
      c_.Text("after loss, backward, step", x + 24, y - 4);
      y += 12;
      entry("zrun peak", FormatBytes(p_.measured_peak_bytes), line(kMeasuredColour, 3));
    }
  }

  const Plan& plan_;
  const Picture& p_;
  Canvas c_;
  double y_step_gib_ = 1, y_max_gib_ = 1;
  std::vector<Box> avoid_;  // line labels the peak label must not cover
};

cairo_status_t AppendToString(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

std::string XmlEscape(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

}  // namespace

absl::StatusOr<std::string> RenderPlot(const Plan& plan, const Report* report, PlotFormat format) {
  ZPLAN_ASSIGN_OR_RETURN(Picture picture, BuildPicture(plan, report));
  std::string bytes;
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      format == PlotFormat::kPng
          ? cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(kWidth), static_cast<int>(kHeight))
          : cairo_svg_surface_create_for_stream(AppendToString, &bytes, kWidth, kHeight),
      cairo_surface_destroy);
  {
    std::unique_ptr<cairo_t, decltype(&cairo_destroy)> cr(cairo_create(surface.get()), cairo_destroy);
    Chart(plan, picture, cr.get()).Draw();
    if (cairo_status(cr.get()) != CAIRO_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("--plot: drawing failed: ", cairo_status_to_string(cairo_status(cr.get()))));
    }
  }
  cairo_status_t status = CAIRO_STATUS_SUCCESS;
  if (format == PlotFormat::kPng) {
    status = cairo_surface_write_to_png_stream(surface.get(), AppendToString, &bytes);
  } else {
    cairo_surface_finish(surface.get());
    status = cairo_surface_status(surface.get());
  }
  if (status != CAIRO_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("--plot: encoding failed: ", cairo_status_to_string(status)));
  }
  if (format == PlotFormat::kSvg) {
    // After the root element's start tag: what the glyph outlines say.
    const size_t svg = bytes.find("<svg");
    const size_t open_end = svg == std::string::npos ? svg : bytes.find('>', svg);
    if (open_end == std::string::npos) return absl::InternalError("--plot: cairo wrote no <svg> element");
    bytes.insert(open_end + 1, absl::StrCat("\n<title>", XmlEscape(PlotTitle(plan)), "</title>\n<desc>",
                                            XmlEscape(PeakLabel(plan)), "</desc>"));
  }
  return bytes;
}

absl::Status WritePlot(const std::string& path, const Plan& plan, const Report* report) {
  ZPLAN_ASSIGN_OR_RETURN(PlotFormat format, PlotFormatForPath(path));
  ZPLAN_ASSIGN_OR_RETURN(std::string bytes, RenderPlot(plan, report, format));
  const absl::Status written = WriteFileAtomically(path, bytes);
  if (written.ok()) return written;
  return absl::Status(written.code(), absl::StrCat("--plot: ", written.message()));
}

}  // namespace zplan
