#include "planner/eager_experts.h"

#include <algorithm>
#include <cstddef>
#include <numeric>

namespace zplan {
namespace {

// Allocations (+) and frees (-) in order: the running total and its peak.
// Mark() starts a second peak, of what comes after it.
class Tally {
 public:
  void Ev(int64_t bytes) {
    run_ += bytes;
    peak_ = std::max(peak_, run_);
    if (marked_) peak_after_mark_ = std::max(peak_after_mark_, run_);
  }
  void Mark() {
    marked_ = true;
    peak_after_mark_ = run_;
  }
  int64_t peak() const { return peak_; }
  int64_t peak_after_mark() const { return peak_after_mark_; }

 private:
  int64_t run_ = 0, peak_ = 0, peak_after_mark_ = 0;
  bool marked_ = false;
};

std::vector<int64_t> Hit(const std::vector<int64_t>& counts) {
  std::vector<int64_t> hit;
  for (int64_t n : counts) {
    if (n > 0) hit.push_back(n);
  }
  return hit;
}

// tools/eager_experts.py, backward_peak_bytes: one line per logged event; the
// recomputed and input_grad_exists orders as the oracle's traces showed them.
// Its peak, and the peak past the down bank's hook (Tally::Mark).
Tally Backward(const std::vector<int64_t>& counts, const EagerExpertsShape& x) {
  const int64_t experts = static_cast<int64_t>(counts.size()), w = x.w, wr = x.wr, h = x.hidden, f = x.ffn;
  const int64_t bank_gate_up = experts * 2 * f * h * w, bank_down = experts * h * f * w;
  const int64_t one_gate_up = 2 * f * h * w, one_down = h * f * w, weights_grad = x.tokens * x.top_k * wr;
  Tally t;
  const std::vector<int64_t> hit = Hit(counts);
  for (std::size_t j = 0; j < hit.size(); ++j) {
    const int64_t n = hit[hit.size() - 1 - j];
    const bool later = j > 0;
    const int64_t nh = n * h * w, nh32 = n * h * 4, ni = n * f * w;
    t.Ev(nh); t.Ev(-nh);  // index_add_: the output gradient's rows; its saved source freed
    // The weighting's backward. Recomputed, the product's saved factors (down's
    // output, the weights slice) go as the checkpoint hands them over, before
    // its gradients are made whole; otherwise with its node.
    if (wr != w) {
      t.Ev(nh32); t.Ev(-nh);                                 // the cast's backward to fp32
      t.Ev(nh32); t.Ev(nh32); t.Ev(-nh32); t.Ev(nh32);       // the weighting's two gradients
      if (x.recomputed) { t.Ev(-nh); t.Ev(-n * wr); }
      t.Ev(nh); t.Ev(-nh32);                                 // down's output gradient cast back
      t.Ev(n * 4); t.Ev(-nh32); t.Ev(-nh32);
      if (x.recomputed) {
        t.Ev(weights_grad); t.Ev(-n * 4);  // the top-k weights' gradient [T, k]
      } else {
        t.Ev(-n * 4);
        t.Ev(-nh);                          // saved down output
        t.Ev(weights_grad); t.Ev(-n * wr);  // the top-k weights' gradient [T, k]; the saved slice
      }
    } else if (x.recomputed) {
      t.Ev(nh); t.Ev(nh); t.Ev(-nh); t.Ev(-n * w);  // down's output's gradient and the product's; saved factors
      t.Ev(n * w); t.Ev(-nh); t.Ev(-nh);           // the weights' sum
      t.Ev(weights_grad); t.Ev(-n * w);
    } else {
      t.Ev(nh); t.Ev(nh); t.Ev(n * w);  // down's output's gradient, the weights' product and sum
      t.Ev(-nh); t.Ev(-nh); t.Ev(-n * w);
      t.Ev(-nh);                          // saved down output
      t.Ev(weights_grad); t.Ev(-n * wr);  // the top-k weights' gradient [T, k]; the saved slice
    }
    if (later) { t.Ev(weights_grad); t.Ev(-weights_grad); t.Ev(-weights_grad); }  // added out of place
    t.Ev(one_down); t.Ev(ni); t.Ev(-nh); t.Ev(-ni);  // down_proj[e]'s gradient, its input's; product freed
    if (later) {
      t.Ev(bank_down); t.Ev(-one_down); t.Ev(-bank_down);  // select_backward, added into the buffer
    } else {
      t.Ev(bank_down); t.Ev(-one_down);                    // the first: the accumulation buffer
    }
    if (j + 1 == hit.size()) t.Mark();  // the down bank's gradient is whole: its hook runs
    t.Ev(ni); t.Ev(ni); t.Ev(-ni); t.Ev(-ni);  // act * up: both gradients; saved act freed
    t.Ev(ni); t.Ev(-ni); t.Ev(-2 * ni);        // silu's; saved gate_up freed
    t.Ev(2 * ni); t.Ev(-ni); t.Ev(-ni);        // chunk's backward: the cat
    t.Ev(one_gate_up); t.Ev(nh); t.Ev(-2 * ni); t.Ev(-nh);  // gate_up_proj[e]'s gradient, its input's
    if (later) {
      t.Ev(bank_gate_up); t.Ev(-one_gate_up); t.Ev(-bank_gate_up);
    } else {
      t.Ev(bank_gate_up); t.Ev(-one_gate_up);
    }
    t.Ev(x.tokens * h * w); t.Ev(-nh); t.Ev(-16 * n);  // hidden_states[token_idx]'s gradient; where's indices
    if (later || x.input_grad_exists) t.Ev(-x.tokens * h * w);
  }
  return t;
}

// tools/eager_experts.py, forward_peak_bytes.
int64_t Forward(const std::vector<int64_t>& counts, const EagerExpertsShape& x, bool grad) {
  const int64_t experts = static_cast<int64_t>(counts.size()), w = x.w, wr = x.wr, h = x.hidden, f = x.ffn;
  const std::vector<int64_t> hit = Hit(counts);
  Tally t;
  t.Ev(x.tokens * h * w);  // the output, zeros_like(hidden_states)
  t.Ev(8); t.Ev(-8); t.Ev(8); t.Ev(-8);
  t.Ev(x.tokens * x.top_k * (experts + 1) * 8);  // the one-hot mask, then its sums
  t.Ev(8 * (experts + 1)); t.Ev(8); t.Ev(experts + 1); t.Ev(-8); t.Ev(-8 * (experts + 1));
  t.Ev(8 * static_cast<int64_t>(hit.size())); t.Ev(-(experts + 1));  // expert_hit: nonzero
  const bool fp32 = wr != w;
  int64_t prev = -1;
  for (int64_t n : hit) {
    const int64_t nh = n * h * w, nh32 = n * h * 4, ni = n * f * w;
    t.Ev(8); t.Ev(1); t.Ev(-8); t.Ev(-1);  // expert_idx == num_experts
    if (grad) {
      t.Ev(16 * n); t.Ev(nh); t.Ev(2 * ni); t.Ev(ni); t.Ev(ni);  // where, rows, gate_up, act, product
      if (fp32 && prev >= 0) t.Ev(-prev * h * 4);               // the last fp32 product, its name rebound
      t.Ev(nh); t.Ev(n * wr);                                   // down's output, the weights slice
      if (fp32) {
        t.Ev(nh32); t.Ev(nh32); t.Ev(-nh32); t.Ev(nh);  // the product (its temporary), the cast index_add_ keeps
      } else {
        t.Ev(nh);
      }
      t.Ev(1024); t.Ev(-1024);  // index_add_'s scratch
    } else {
      const int64_t p = prev;
      t.Ev(16 * n);
      if (p >= 0) t.Ev(-16 * p);
      t.Ev(nh);
      if (p >= 0) t.Ev(-p * h * w);
      t.Ev(2 * ni);
      if (p >= 0) t.Ev(-2 * p * f * w);
      t.Ev(ni); t.Ev(ni); t.Ev(-ni);  // act, product; act freed
      if (p >= 0) t.Ev(-(p * h * (fp32 ? 4 : w)));  // the last weighted product
      t.Ev(nh); t.Ev(-ni); t.Ev(n * wr);  // down's output; product freed; the weights slice
      if (fp32) {
        t.Ev(nh32); t.Ev(nh32); t.Ev(-nh32); t.Ev(-n * wr); t.Ev(-nh); t.Ev(nh); t.Ev(1024); t.Ev(-1024); t.Ev(-nh);
      } else {
        t.Ev(nh); t.Ev(-n * wr); t.Ev(-nh); t.Ev(1024); t.Ev(-1024);
      }
    }
    prev = n;
  }
  return t.peak();
}

}  // namespace

EagerExpertsBytes EagerExpertsAllocations(const std::vector<int64_t>& counts, const EagerExpertsShape& x) {
  EagerExpertsBytes out;
  const int64_t pairs = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  out.saved = pairs * (16 + x.wr + (3 * x.hidden + 4 * x.ffn) * x.w);
  out.forward_peak = Forward(counts, x, /*grad=*/true);
  out.nograd_peak = Forward(counts, x, /*grad=*/false);
  const Tally backward = Backward(counts, x);
  out.backward_peak = backward.peak();
  out.past_down_hook_peak = backward.peak_after_mark();
  return out;
}

}  // namespace zplan
