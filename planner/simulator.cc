#include "planner/simulator.h"

#include <utility>

#include "planner/status_macros.h"
#include "planner/step_program.h"

namespace zplan {
namespace {

void Add(Component component, int64_t bytes, MemoryBreakdown* live) {
  switch (component) {
    case COMPONENT_PARAMS: live->set_params_bytes(live->params_bytes() + bytes); break;
    case COMPONENT_GRADS: live->set_grads_bytes(live->grads_bytes() + bytes); break;
    case COMPONENT_MASTER_PARAMS: live->set_master_params_bytes(live->master_params_bytes() + bytes); break;
    case COMPONENT_OPTIMIZER_STATES: live->set_optimizer_states_bytes(live->optimizer_states_bytes() + bytes); break;
    case COMPONENT_ACTIVATIONS: live->set_activations_bytes(live->activations_bytes() + bytes); break;
    case COMPONENT_LOGITS: live->set_logits_bytes(live->logits_bytes() + bytes); break;
    case COMPONENT_BUFFERS: live->set_buffers_bytes(live->buffers_bytes() + bytes); break;
    case COMPONENT_TEMPORARIES: live->set_temporaries_bytes(live->temporaries_bytes() + bytes); break;
    default: ZPLAN_CHECK(false);
  }
}

}  // namespace

SimulatedStep ExpandStepProgram(const StepProgram& program, const StepSizes& sizes, bool record_events) {
  SimulatedStep step;
  MemoryBreakdown live;
  int64_t total = 0, peak_total = -1;
  int event_count = 0;
  for (const StepGroup& group : program.groups) {
    for (int r = 0; r < group.repeat; ++r) {
      for (int j = group.first_op; j < group.first_op + group.num_ops; ++j) {
        const StepOp& op = program.ops[j];
        const bool alloc = op.kind == MemoryEvent::ALLOC;
        Add(op.component, alloc ? op.bytes : -op.bytes, &live);
        total += alloc ? op.bytes : -op.bytes;
        const int layer = op.layer + r * group.layer_step;
        if (total > peak_total) {
          peak_total = total;
          step.peak = live;
          step.peak.set_peak_event(TensorName(op.tensor, layer, sizes.tower_layers));
          step.peak_event_index = event_count;
        }
        ++event_count;
        if (!record_events) continue;
        step.event_handles.push_back(op.handle + r * group.handle_step);
        MemoryEvent& event = step.events.emplace_back();
        event.set_kind(op.kind);
        event.set_component(op.component);
        event.set_bytes(op.bytes);
        event.set_tensor(TensorName(op.tensor, layer, sizes.tower_layers));
        event.set_phase(op.phase);
        event.set_layer(layer);
        event.set_live_bytes(total);
      }
    }
  }
  FinishDeviceBreakdown(sizes, &step.peak);
  return step;
}

SimulatedStep SimulateStep(const StepSizes& sizes, bool record_events) {
  return ExpandStepProgram(BuildStepProgram(sizes), sizes, record_events);
}

}  // namespace zplan
