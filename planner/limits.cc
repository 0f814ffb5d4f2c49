#include "planner/limits.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/inventory.h"

namespace zplan {

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t min, int64_t max,
                        absl::string_view meaning) {
  if (value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " is outside ", min, " .. ", max, " (", meaning, ")"));
}

absl::Status CheckFields(std::initializer_list<BoundedField> fields) {
  for (const BoundedField& f : fields) {
    if (absl::Status s = CheckRange(f.name, f.value, f.min, f.max, f.meaning); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(absl::string_view field, double value, double min, double max, absl::string_view meaning) {
  if (std::isfinite(value) && value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " is outside ", min, " .. ", max, " (", meaning, ")"));
}

absl::Status CheckUtf8(absl::string_view field, absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    // Sequence length, and the range of the second byte (RFC 3629, section 4).
    int length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c < 0x80) {
      length = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    }
    bool valid = length > 0 && i + static_cast<size_t>(length) <= text.size();
    for (int k = 1; valid && k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      valid = k == 1 ? next >= low && next <= high : next >= 0x80 && next <= 0xBF;
    }
    if (!valid) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": not valid UTF-8 (byte ", i,
                                                     "); use a plain name"));
    }
    i += static_cast<size_t>(length);
  }
  return absl::OkStatus();
}

absl::Status ValidateSizes(const ModelSpec& m, const RunConfig& c) {
  if (m.has_vision() && c.seq_length() != VisionTokens(m)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "seq_length (--seq): %d, but a ViT's sequence is fixed by its image: (%d / %d)^2 patches + CLS = %d "
        "tokens; leave --seq out (zplan uses %d) or change the image or patch size",
        c.seq_length(), m.vision().image_size(), m.vision().patch_size(), VisionTokens(m), VisionTokens(m)));
  }
  const double layers = static_cast<double>(m.num_layers()), h = static_cast<double>(m.hidden_size());
  const double heads = static_cast<double>(m.num_attention_heads()), kv = static_cast<double>(m.num_kv_heads());
  const double head_dim = static_cast<double>(m.head_dim()), ffn = static_cast<double>(m.ffn_hidden_size());
  const double vocab = static_cast<double>(m.vocab_size());
  const double tokens = static_cast<double>(c.micro_batch_size()) * static_cast<double>(c.seq_length());
  // Per block: q, k, v, o and three FFN matrices (an upper bound for two-matrix FFNs); a mixture of
  // experts' layers hold three per expert and the shared expert's, and keep k of them per token.
  const MoeSpec& moe = m.moe();
  const double experts_width = static_cast<double>(moe.num_experts()) * static_cast<double>(moe.expert_ffn_hidden_size()) +
                               static_cast<double>(moe.shared_expert_ffn_hidden_size());
  const double per_token_width =
      static_cast<double>(moe.experts_per_token()) * (2 * h + 4 * static_cast<double>(moe.expert_ffn_hidden_size()));
  const double parameters = layers * (h * head_dim * (2 * heads + 2 * kv) + 3 * h * std::fmax(ffn, experts_width)) +
                            2 * vocab * h + static_cast<double>(m.max_position_embeddings()) * h;
  if (parameters > static_cast<double>(kMaxParameters)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model: about %.3g parameters is more than zplan plans (%.3g); check num_layers, hidden_size, "
        "ffn_hidden_size and vocab_size",
        parameters, static_cast<double>(kMaxParameters)));
  }
  struct Product {
    const char* what;
    double bytes;
    const char* fix;
  };
  // fp32, the widest element any of them is held in.
  const Product products[] = {
      {"the logits (micro-batch x seq x vocab)", 4 * tokens * vocab, "--micro-batch or --seq"},
      {"the attention scores (micro-batch x heads x seq x seq)", 4 * tokens * heads * static_cast<double>(c.seq_length()),
       "--seq or --micro-batch"},
      {"the activations (micro-batch x seq x width x layers)",
       4 * tokens * std::fmax(std::fmax(std::fmax(h, ffn), heads * head_dim), per_token_width) * layers * 16,
       "--micro-batch or --seq"},
      {"the model states (parameters x 16 bytes)", 16 * parameters, "the model's dimensions"},
  };
  for (const Product& p : products) {
    if (p.bytes > kMaxDerivedBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s would take about %.3g bytes, more than any machine has (zplan stops at %.3g); reduce %s", p.what,
          p.bytes, kMaxDerivedBytes, p.fix));
    }
  }
  return absl::OkStatus();
}

}  // namespace zplan
