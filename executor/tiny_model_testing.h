// File: tiny_model_testing.h
// The executor tests' tiny Llama-style model: 2 layers, hidden 64, 4 heads
// over 2 key/value heads, a SwiGLU MLP of 160 and a 256-token vocabulary,
// small enough that a ZeRO step on CPU ranks takes milliseconds.
#ifndef ZPLAN_EXECUTOR_TINY_MODEL_TESTING_H_
#define ZPLAN_EXECUTOR_TINY_MODEL_TESTING_H_

#include "proto/model.pb.h"

namespace zplan {

ModelSpec TinyModel();

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_TINY_MODEL_TESTING_H_
