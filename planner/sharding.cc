#include "planner/sharding.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "planner/inventory.h"
#include "planner/units.h"

namespace zplan {

int64_t FlatShardElements(int64_t elements, int64_t world) {
  return RoundUp(elements, kFlatAlignmentElements * world) / world;
}

ShardLayout ComputeShardLayout(const std::vector<TensorSpec>& parameters, int64_t world,
                               int64_t persistence_threshold_elements) {
  ShardLayout layout;
  layout.world_size = world;
  for (const TensorSpec& tensor : parameters) {
    const int64_t numel = NumElements(tensor);
    const int64_t chunk = Stage3ShardElements(numel, world);
    layout.total_elements += numel;
    layout.stage3_chunk_elements += chunk;
    if (!tensor.frozen()) {
      layout.trainable_elements += numel;
      layout.stage3_grad_shard_elements += chunk;
    }
    const bool adapter = IsLoraAdapter(tensor);
    if (adapter) layout.stage3_adapter_chunk_elements += chunk;
    if (numel <= persistence_threshold_elements) {
      layout.stage3_persistent_elements += numel;
      if (adapter) layout.stage3_adapter_persistent_elements += numel;
    } else {
      layout.stage3_shard_elements += chunk;
    }
  }
  layout.flat_shard_elements = FlatShardElements(layout.trainable_elements, world);
  layout.flat_padded_elements = layout.flat_shard_elements * world;
  return layout;
}

std::vector<FlatPartition> FlatPartitionsByRank(const std::vector<TensorSpec>& parameters, int64_t world) {
  int64_t total = 0;
  for (const TensorSpec& tensor : parameters) total += NumElements(tensor);
  const int64_t shard = FlatShardElements(total, world);
  std::vector<FlatPartition> out(world);
  int64_t offset = 0;
  for (int i = 0; i < static_cast<int>(parameters.size()); ++i) {
    const int64_t begin = offset, end = offset + NumElements(parameters[i]);
    offset = end;
    for (int64_t rank = begin / shard; rank < world && rank * shard < end; ++rank) {
      FlatPartition& p = out[rank];
      p.params_elements += end - begin;
      p.max_piece_elements =
          std::max(p.max_piece_elements, std::min(end, (rank + 1) * shard) - std::max(begin, rank * shard));
      if (p.first_param < 0) p.first_param = i;
      p.last_param = i;
    }
  }
  return out;
}

Stage3Retention Stage3RetentionOf(const ModelSpec& model, const std::vector<TensorSpec>& parameters,
                                  bool tied_embeddings, const ZeroConfig& zero,
                                  const std::vector<bool>& runs_backward) {
  const ParameterlessModules calls = ParameterlessModulesOf(model);
  const int n = static_cast<int>(parameters.size());
  std::vector<int64_t> numel(n);
  for (int p = 0; p < n; ++p) numel[p] = NumElements(parameters[p]);
  // Modules in forward order (parameters of one module are adjacent); a
  // module that never runs is in no trace. A leaf block's parameters are
  // its module's ("layers.<i>.mlp").
  std::vector<bool> in_leaf(n);
  for (int p = 0; p < n; ++p) in_leaf[p] = DeepSpeedLeafBlockOf(model, parameters[p]) >= 0;
  auto module_of = [&](int p) {
    const std::string& name = parameters[p].name();
    if (in_leaf[p]) {
      const std::vector<absl::string_view> parts = absl::StrSplit(name, absl::MaxSplits('.', 3));
      if (parts.size() == 4) return absl::StrCat(parts[0], ".", parts[1], ".", parts[2]);
    }
    return name.substr(0, name.rfind('.'));
  };
  std::vector<std::vector<int>> modules;
  for (int p = 0; p < n; ++p) {
    if (IsUnusedOriginal(parameters[p].name())) continue;
    if (modules.empty() || module_of(p) != module_of(modules.back().back())) modules.emplace_back();
    modules.back().push_back(p);
  }
  std::vector<bool> leaf_module(modules.size());
  for (size_t m = 0; m < modules.size(); ++m) leaf_module[m] = in_leaf[modules[m].front()];
  // The embedding's matrix: the token embedding, or a ViT's patch projection.
  int embedding = -1;
  for (int p = 0; p < n && embedding < 0; ++p) {
    const std::string& name = parameters[p].name();
    const bool token_embedding = absl::StartsWith(name, "embed_tokens.") && !IsUnusedOriginal(name);
    if (token_embedding || name == "embed_patches.projection.weight") embedding = p;
  }
  const bool has_embedding = embedding >= 0;
  int head = -1;  // the head module's index in `modules`
  if (tied_embeddings && embedding == 0) {
    modules.push_back({0});
    head = static_cast<int>(modules.size()) - 1;
  } else if (n > 0 && (parameters[n - 1].name().rfind("lm_head", 0) == 0 ||
                       parameters[n - 1].name().rfind("classifier", 0) == 0)) {
    head = static_cast<int>(modules.size()) - 1;
  }
  auto backward = [&](int m) {
    if (runs_backward.empty()) return true;
    for (int p : modules[m]) {
      if (runs_backward[p]) return true;
    }
    return false;
  };
  // The module trace DeepSpeed records: every module's forward pre-hook in
  // call order, then every module's backward pre-hook, a container's before
  // its children's, which run in reverse. The tree: the model (and its
  // decoder) without parameters of their own, the embeddings, the calls
  // without parameters after them (calls), the layers, each holding its
  // norms and containers (its attention, MLP or conv: "layers.<i>.<c>.<m>"),
  // the final norm; then the head.
  struct Node {
    int module = -1;  // into `modules`; -1: no parameters of its own
    bool backward = true;
    std::vector<Node> children;
  };
  const Node none;
  Node forward_only;
  forward_only.backward = false;
  Node root, decoder;
  Node* layer = nullptr;
  Node* container = nullptr;
  std::string layer_name, container_name;
  auto close_container = [&] {
    if (container == nullptr) return;
    const bool mlp = container_name == "mlp";
    if (mlp ? calls.mlp_output_dropout : calls.attention_output_dropout && container_name == "attn") {
      container->children.push_back(none);
    }
    if (calls.half_dropouts) layer->children.push_back(none);
    container = nullptr;
  };
  bool after_embeddings = false;
  for (int m = 0; m < static_cast<int>(modules.size()); ++m) {
    if (m == head) continue;
    const std::string path = module_of(modules[m].front());
    Node leaf;
    leaf.module = m;
    leaf.backward = backward(m);
    const std::vector<std::string> parts = absl::StrSplit(path, '.');
    if (parts.size() < 3 || parts[0] != "layers") {
      close_container();
      layer = nullptr;
      decoder.children.push_back(leaf);
      continue;
    }
    if (!after_embeddings) {
      // The rotary embedding (forward only) and the embeddings' dropout.
      for (int i = 0; i < calls.rotary_calls; ++i) decoder.children.push_back(forward_only);
      if (calls.embedding_dropout) decoder.children.push_back(none);
      after_embeddings = true;
    }
    if (layer == nullptr || parts[1] != layer_name) {
      close_container();
      decoder.children.emplace_back();
      layer = &decoder.children.back();
      layer_name = parts[1];
    }
    if (parts.size() < 4) {
      close_container();
      layer->children.push_back(leaf);
      continue;
    }
    if (container == nullptr || parts[2] != container_name) {
      close_container();
      layer->children.emplace_back();
      container = &layer->children.back();
      container_name = parts[2];
    }
    container->children.push_back(leaf);
    if (container_name == "mlp" && container->children.size() == 1 && calls.mlp_activation) {
      container->children.push_back(none);
    }
  }
  close_container();
  root.children.push_back(decoder);
  if (head >= 0) {
    Node h;
    h.module = head;
    root.children.push_back(h);
  }
  // A container runs backward where something in it does.
  std::function<bool(Node&)> settle = [&](Node& node) {
    if (node.module >= 0 || node.children.empty()) return node.backward;
    bool any = false;
    for (Node& child : node.children) any = settle(child) || any;
    return node.backward = any;
  };
  settle(root);
  // Every parameter under a node (the parameters iter_params(module,
  // recurse=True) yields).
  std::function<std::vector<int>(const Node&)> subtree = [&](const Node& node) {
    std::vector<int> out = node.module >= 0 ? modules[node.module] : std::vector<int>{};
    for (const Node& child : node.children) {
      const std::vector<int> more = subtree(child);
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  };
  std::vector<int> trace;
  std::vector<std::vector<int>> trace_subtree;
  std::function<void(const Node&, bool)> walk = [&](const Node& node, bool forward) {
    if (!forward && !node.backward) return;
    trace.push_back(node.module);
    trace_subtree.push_back(subtree(node));
    if (forward) {
      for (const Node& child : node.children) walk(child, true);
    } else {
      for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) walk(*it, false);
    }
  };
  walk(root, true);
  const int forward_end = static_cast<int>(trace.size());
  walk(root, false);
  struct Entry {
    int param;
    int step;
  };
  std::vector<Entry> queue;
  for (int t = 0; t < static_cast<int>(trace.size()); ++t) {
    if (trace[t] >= 0) {
      for (int p : modules[trace[t]]) queue.push_back({p, t});
    }
  }
  auto persistent = [&](int p) { return numel[p] <= zero.stage3_param_persistence_threshold(); };
  std::vector<bool> available(n), kept_forward(n, false);
  for (int p = 0; p < n; ++p) available[p] = persistent(p);
  std::vector<int64_t> last_popped(n, -1);
  int64_t n_available = 0;
  size_t front = 0;
  Stage3Retention out;
  out.embedding_kept = has_embedding;
  out.head_kept = head >= 0;
  auto gather = [&](int p) {
    if (available[p]) return;
    available[p] = true;
    n_available += numel[p];
  };
  for (int t = 0; t < static_cast<int>(trace.size()); ++t) {
    if (t == forward_end) {
      // What a prefetch gathered again after its forward release stays
      // until its backward, as what was kept does.
      for (int p = 0; p < n; ++p) {
        if (!available[p] || persistent(p)) continue;
        kept_forward[p] = true;
        if (p == embedding) out.embedding_kept = true;
      }
      if (head >= 0) out.head_kept = available[modules[head].front()];
    }
    const std::vector<int> empty;
    const std::vector<int>& params = trace[t] >= 0 ? modules[trace[t]] : empty;
    // fetch_sub_module: this module's parameters, its queue entries, then the prefetch.
    int to_pop = 0;
    for (int p : params) {
      if (last_popped[p] < t) ++to_pop;
      gather(p);
    }
    for (; to_pop > 0 && front < queue.size(); --to_pop, ++front) last_popped[queue[front].param] = queue[front].step;
    if (zero.stage3_prefetch_bucket_elements() > 0) {
      const int64_t limit =
          std::min(zero.stage3_max_live_parameters() - n_available, zero.stage3_prefetch_bucket_elements());
      int64_t prefetching = 0;
      std::vector<int> prefetch;
      while (front < queue.size() && prefetching < limit) {
        const Entry e = queue[front++];
        last_popped[e.param] = std::max<int64_t>(last_popped[e.param], e.step);
        if (!available[e.param] && std::find(prefetch.begin(), prefetch.end(), e.param) == prefetch.end()) {
          prefetch.push_back(e.param);
          prefetching += numel[e.param];
        }
      }
      for (int p : prefetch) gather(p);
    }
    // release_sub_module: the step counter has moved past this module.
    // The reuse scan (sharding.h): a leaf's reads subtrees, another's reads
    // modules' own parameters (a leaf has none: they are its children's).
    const int next = t + 1;
    const bool releasing_leaf = trace[t] >= 0 && leaf_module[trace[t]];
    for (int p : params) {
      if (persistent(p)) continue;
      bool keep = last_popped[p] > next;
      int64_t traversed = 0;
      for (int u = next; !keep && u < static_cast<int>(trace.size()); ++u) {
        if (traversed >= zero.stage3_max_reuse_distance()) break;
        const bool own = trace[u] >= 0 && !leaf_module[trace[u]];
        for (int q : releasing_leaf ? trace_subtree[u] : own ? modules[trace[u]] : empty) {
          keep = keep || q == p;
          traversed += numel[q];
        }
      }
      if (t < forward_end && trace[t] != head) kept_forward[p] = keep;
      if (trace[t] == head && t < forward_end) out.head_kept = keep;
      const bool final_use = t >= forward_end && (p != embedding || trace[t] != head);
      if (!keep && !final_use && p == embedding) out.embedding_kept = false;
      if (!keep && available[p]) {
        available[p] = false;
        n_available -= numel[p];
      }
    }
  }
  out.kept_after_forward = kept_forward;
  if (head >= 0 && !(tied_embeddings && embedding == 0)) {
    for (int p : modules[head]) out.kept_after_forward[p] = out.head_kept;
  }
  return out;
}

}  // namespace zplan
