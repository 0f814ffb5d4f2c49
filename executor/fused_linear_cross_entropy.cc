#include "executor/fused_linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/Dispatch.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "planner/memory_model.h"

namespace zplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// CUDA: rows turned into gradients per fp32 block. Liger's Triton kernel
// works in registers; ATen's ops need this block (zrun's only allocation
// beyond Liger's, at most this many bytes).
constexpr int64_t kCudaRowBlockBytes = int64_t{8} << 20;

// Liger's Triton kernel as a loop: one pass for the max, one for the sum of
// exponentials, one writing the gradient; nothing is allocated.
void CrossEntropyRowsCpu(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& loss, double scale) {
  const int64_t rows = logits.size(0), v = logits.size(1);
  const at::Tensor y = targets.contiguous();
  const int64_t* target = y.data_ptr<int64_t>();
  float* out = loss.data_ptr<float>();
  const float s = static_cast<float>(scale);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "CrossEntropyRowsCpu", [&] {
    scalar_t* x = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* row = x + r * v;
        const int64_t t = target[r];
        if (t == kIgnoreIndex) {
          std::fill(row, row + v, static_cast<scalar_t>(0));
          out[r] = 0;
          continue;
        }
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<float>(row[j]));
        float d = 0;
        for (int64_t j = 0; j < v; ++j) d += std::exp(static_cast<float>(row[j]) - m);
        const float x_t = static_cast<float>(row[t]);
        out[r] = (m + std::log(d) - x_t) * s;
        for (int64_t j = 0; j < v; ++j) row[j] = static_cast<scalar_t>(std::exp(static_cast<float>(row[j]) - m) / d * s);
        // As the kernel: the target's gradient once more from the fp32 logit, so
        // softmax - 1 is not rounded twice.
        row[t] = static_cast<scalar_t>((std::exp(x_t - m) / d - 1.0f) * s);
      }
    });
  });
}

void CrossEntropyRowsCuda(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& loss,
                          double scale) {
  const int64_t rows = logits.size(0), v = logits.size(1);
  const int64_t block = std::max<int64_t>(1, kCudaRowBlockBytes / (v * 4));
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t n = std::min(block, rows - r0);
    const at::Tensor x = logits.narrow(0, r0, n);
    const at::Tensor t = targets.narrow(0, r0, n);
    const at::Tensor ignored = t.eq(kIgnoreIndex).unsqueeze(1);
    const at::Tensor index = t.masked_fill(t.eq(kIgnoreIndex), 0).unsqueeze(1);
    at::Tensor f = x.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    const at::Tensor x_t = f.gather(1, index);
    const at::Tensor m = std::get<0>(f.max(1, /*keepdim=*/true));
    f.sub_(m).exp_();
    const at::Tensor d = f.sum(1, /*keepdim=*/true);
    loss.narrow(0, r0, n).copy_(((m + d.log() - x_t) * scale).masked_fill_(ignored, 0).squeeze(1));
    f.div_(d).scatter_add_(1, index, at::full({n, 1}, -1.0, f.options())).mul_(scale).masked_fill_(ignored, 0);
    x.copy_(f);
  }
}

struct FusedLinearCrossEntropyFunction : public torch::autograd::Function<FusedLinearCrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& targets) {
    const int64_t n = input.size(0), h = input.size(1), v = weight.size(0);
    const int64_t chunk = FusedLossChunkTokens(n, v, h);
    at::Tensor grad_input = at::zeros_like(input);
    at::Tensor grad_weight = weight.requires_grad() ? at::zeros_like(weight) : at::Tensor();
    at::Tensor loss_rows = at::zeros({n}, input.options().dtype(at::kFloat));
    // "mean" over the rows that count (Liger's n_non_ignore).
    const at::Tensor counted = targets.ne(kIgnoreIndex);
    const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, counted.sum().item<int64_t>()));
    // Liger's out= paths (_can_use_mm_out): CUDA, input and weight of one dtype.
    const bool mm_out = input.is_cuda() && input.scalar_type() == weight.scalar_type();
    at::Tensor storage = mm_out ? at::empty({chunk, v}, input.options()) : at::Tensor();
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      const at::Tensor x = input.narrow(0, start, rows);
      at::Tensor logits = mm_out ? storage.narrow(0, 0, rows) : at::mm(x, weight.t());
      if (mm_out) at::mm_out(logits, x, weight.t());
      CrossEntropyRowsInPlace(logits, targets.narrow(0, start, rows), loss_rows.narrow(0, start, rows), scale);
      if (mm_out) {
        at::Tensor rows_grad = grad_input.narrow(0, start, rows);
        at::mm_out(rows_grad, logits, weight);
      } else {
        grad_input.narrow(0, start, rows).copy_(at::mm(logits, weight));
      }
      if (grad_weight.defined()) {
        if (input.is_cuda() && logits.scalar_type() != at::kFloat && grad_weight.scalar_type() == logits.scalar_type()) {
          grad_weight.addmm_(logits.t(), x);
        } else {
          // Liger's fallback: the product cast to fp32, added in place. Two
          // statements, as in Python: the 16-bit product is freed before the add.
          const at::Tensor product = at::mm(logits.t(), x).to(at::kFloat);
          grad_weight.add_(product);
        }
      }
    }
    storage.reset();
    ctx->save_for_backward({grad_input, grad_weight});
    return loss_rows.sum();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor& grad_input = saved[0];
    at::Tensor& grad_weight = saved[1];
    // fused_linear_cross_entropy_backward: scaled in place unless the incoming gradient is 1.
    if (grads[0].item<double>() != 1.0) {
      grad_input.mul_(grads[0]);
      if (grad_weight.defined()) grad_weight.mul_(grads[0]);
    }
    return {grad_input, grad_weight, at::Tensor()};
  }
};

}  // namespace

void CrossEntropyRowsInPlace(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& loss,
                             double scale) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "CrossEntropyRowsInPlace: contiguous [rows, V] logits");
  TORCH_CHECK(targets.scalar_type() == at::kLong && loss.scalar_type() == at::kFloat,
              "CrossEntropyRowsInPlace: int64 targets, fp32 losses");
  if (logits.is_cuda()) {
    CrossEntropyRowsCuda(logits, targets, loss, scale);
  } else {
    CrossEntropyRowsCpu(logits, targets, loss, scale);
  }
}

at::Tensor FusedLinearCrossEntropy(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& targets) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && input.size(1) == weight.size(1) && targets.dim() == 1 &&
                  targets.size(0) == input.size(0),
              "FusedLinearCrossEntropy: input [n, h], weight [V, h], targets [n]");
  {
    // Checked once, before the loss allocates anything.
    const at::Tensor counted = targets.masked_fill(targets.eq(kIgnoreIndex), 0);
    TORCH_CHECK(counted.min().item<int64_t>() >= 0 && counted.max().item<int64_t>() < weight.size(0),
                "FusedLinearCrossEntropy: a target outside [0, ", weight.size(0), ")");
  }
  return FusedLinearCrossEntropyFunction::apply(input, weight, targets);
}

}  // namespace zplan
