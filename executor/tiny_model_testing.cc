#include "executor/tiny_model_testing.h"

#include "planner/model_spec.h"

namespace zplan {

ModelSpec TinyModel() {
  ModelSpec spec;
  spec.set_name("tiny");
  spec.set_num_layers(2);
  spec.set_hidden_size(64);
  spec.set_num_attention_heads(4);
  spec.set_num_kv_heads(2);
  spec.set_ffn_hidden_size(160);
  spec.set_ffn_type(FFN_SWIGLU);
  spec.set_vocab_size(256);
  spec.set_norm_type(NORM_RMSNORM);
  spec.set_attention_impl(ATTENTION_SDPA);
  return ResolveModelSpec(spec);
}

}  // namespace zplan
