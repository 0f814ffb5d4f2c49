#include "executor/collectives.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zplan {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

constexpr auto kReleaseWait = std::chrono::seconds(1);

absl::string_view FirstLine(absl::string_view text) { return text.substr(0, text.find('\n')); }

// Runs a c10d call, turning exceptions (peer gone, timeout) into a Status.
template <typename Fn>
absl::Status Guard(const char* what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    // One line: the message without LibTorch's C++ stack (ZRUN_BACKTRACE is for the trainer's errors).
    return absl::UnavailableError(
        absl::StrCat(what, " failed (a rank died or timed out?): ", FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, " failed (a rank died or timed out?): ", FirstLine(e.what())));
  }
}

class C10dCollectives : public Collectives {
 public:
  C10dCollectives(RankInfo info, c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend,
                  std::string name)
      : info_(std::move(info)), store_(std::move(store)), backend_(std::move(backend)), name_(std::move(name)) {}

  int rank() const override { return info_.rank; }
  int world_size() const override { return info_.world_size; }
  std::string name() const override { return name_; }

  absl::Status AllReduceSum(at::Tensor& t) override {
    return Guard("all-reduce", [&] {
      std::vector<at::Tensor> tensors{t};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      Finish(backend_->allreduce(tensors, options));
    });
  }

  absl::Status ReduceScatterSum(at::Tensor& input, at::Tensor& output) override {
    if (name_ == "gloo") {
      // Gloo's reduce-scatter (ProcessGroupGloo::reduce_scatter_tensor_coalesced)
      // all-reduces a clone of the input and copies this rank's chunk out, as
      // under DeepSpeed's ZeRO-3 on CPU ranks. Done here step by step so that
      // Finish sees the inner all-reduce: through _reduce_scatter_base the
      // clone lives on in Gloo's worker thread and is freed at random.
      at::Tensor copy = input.clone();
      absl::Status status = AllReduceSum(copy);
      if (status.ok()) output.copy_(copy.chunk(info_.world_size)[info_.rank]);
      return status;
    }
    return Guard("reduce-scatter", [&] {  // NCCL's makes no copy
      c10d::ReduceScatterOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      Finish(backend_->_reduce_scatter_base(output, input, options));
    });
  }

  absl::Status AllGather(const at::Tensor& input, at::Tensor& output) override {
    return Guard("all-gather", [&] {
      at::Tensor in = input;
      Finish(backend_->_allgather_base(output, in));
    });
  }

  absl::Status AllGatherInPlace(at::Tensor& flat) override {
    const int world = info_.world_size;
    if (world == 1) return absl::OkStatus();
    const int64_t n = flat.numel() / world;
    if (name_ == "gloo") {
      // Gloo's all-gather stages through copies; summing the buffer with every
      // other rank's chunk zeroed needs none.
      if (info_.rank > 0) flat.narrow(0, 0, n * info_.rank).zero_();
      if (info_.rank < world - 1) flat.narrow(0, n * (info_.rank + 1), n * (world - 1 - info_.rank)).zero_();
      return AllReduceSum(flat);
    }
    return Guard("all-gather", [&] {
      at::Tensor in = flat.narrow(0, n * info_.rank, n);  // NCCL gathers in place
      Finish(backend_->_allgather_base(flat, in));
    });
  }

  absl::Status Broadcast(at::Tensor& t, int root) override {
    return Guard("broadcast", [&] {
      std::vector<at::Tensor> tensors{t};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      Finish(backend_->broadcast(tensors, options));
    });
  }

  absl::Status Barrier() override {
    return Guard("barrier", [&] { backend_->barrier()->wait(); });
  }

  absl::StatusOr<std::vector<std::string>> GatherToRankZero(const std::string& key,
                                                            const std::string& value) override {
    std::vector<std::string> values;
    absl::Status status = Guard("gather through the store", [&] {
      store_->set(absl::StrCat(key, "/", info_.rank), std::vector<uint8_t>(value.begin(), value.end()));
      if (info_.rank != 0) return;
      for (int r = 0; r < info_.world_size; ++r) {
        const std::vector<uint8_t> bytes = store_->get(absl::StrCat(key, "/", r));
        values.emplace_back(bytes.begin(), bytes.end());
      }
    });
    if (!status.ok()) return status;
    return values;
  }

 private:
  // Waits for `work`, and on gloo until its worker thread has dropped its
  // reference too: ProcessGroupGloo::runLoop keeps the work, and with it the
  // tensors, in workInProgress_ until it relocks, a moment after wait()
  // returns. A buffer the caller frees then would live on at random (the
  // counting allocator saw it as one extra bucket). Bounded: a stuck thread
  // only delays the free.
  void Finish(const c10::intrusive_ptr<c10d::Work>& work) const {
    work->wait();
    if (name_ != "gloo") return;
    const auto deadline = std::chrono::steady_clock::now() + kReleaseWait;
    while (work.use_count() > 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  }

  RankInfo info_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::string name_;
};

// One process as rank r of N: shapes and memory as in the real run, no peers.
class EmulatedCollectives : public Collectives {
 public:
  explicit EmulatedCollectives(RankInfo info) : info_(std::move(info)) {}
  int rank() const override { return info_.rank; }
  int world_size() const override { return info_.world_size; }
  std::string name() const override { return "emulated"; }
  // Every peer is taken to hold what this rank holds (as the all-gathers
  // replicate it), so a sum is world_size times the local value, in place.
  absl::Status AllReduceSum(at::Tensor& tensor) override {
    tensor.mul_(info_.world_size);
    return absl::OkStatus();
  }
  absl::Status ReduceScatterSum(at::Tensor& input, at::Tensor& output) override {
    const int64_t n = output.numel();
    output.copy_(input.narrow(0, n * info_.rank, n)).mul_(info_.world_size);
    return absl::OkStatus();
  }
  absl::Status AllGather(const at::Tensor& input, at::Tensor& output) override {
    const int64_t n = input.numel();
    for (int r = 0; r < info_.world_size; ++r) output.narrow(0, n * r, n).copy_(input);
    return absl::OkStatus();
  }
  absl::Status AllGatherInPlace(at::Tensor& flat) override {
    const int64_t n = flat.numel() / info_.world_size;
    const at::Tensor mine = flat.narrow(0, n * info_.rank, n);
    for (int r = 0; r < info_.world_size; ++r) {
      if (r != info_.rank) flat.narrow(0, n * r, n).copy_(mine);
    }
    return absl::OkStatus();
  }
  absl::Status Broadcast(at::Tensor&, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<std::string>> GatherToRankZero(const std::string&, const std::string& value) override {
    return std::vector<std::string>{value};
  }

 private:
  RankInfo info_;
};

absl::Status ReadIntVar(const char* name, int* out) {
  const char* value = std::getenv(name);
  if (value == nullptr) return absl::NotFoundError(name);
  if (!absl::SimpleAtoi(value, out) || *out < 0) {
    return absl::InvalidArgumentError(absl::StrCat("environment ", name, "=\"", value, "\" is not a rank count"));
  }
  return absl::OkStatus();
}

// "gnode[10,20-21],other" -> "gnode10".
std::string FirstSlurmHost(const std::string& list) {
  const size_t bracket = list.find('[');
  const size_t comma = list.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return list.substr(0, comma);
  }
  std::string first = list.substr(bracket + 1);
  first = first.substr(0, first.find_first_of(",-]"));
  return list.substr(0, bracket) + first;
}

}  // namespace

absl::StatusOr<std::optional<RankInfo>> RankInfoFromEnvironment() {
  RankInfo info;
  if (std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr) {
    for (auto [name, field] : {std::pair<const char*, int*>{"RANK", &info.rank}, {"WORLD_SIZE", &info.world_size},
                               {"LOCAL_RANK", &info.local_rank}, {"MASTER_PORT", &info.master_port}}) {
      absl::Status s = ReadIntVar(name, field);
      if (absl::IsNotFound(s)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "RANK/WORLD_SIZE are set but ", name, " is not; set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT"));
      }
      if (!s.ok()) return s;
    }
    info.local_world_size = info.world_size;
    if (absl::Status s = ReadIntVar("LOCAL_WORLD_SIZE", &info.local_world_size); !s.ok() && !absl::IsNotFound(s)) {
      return s;
    }
    const char* addr = std::getenv("MASTER_ADDR");
    if (addr == nullptr) return absl::InvalidArgumentError("RANK is set but MASTER_ADDR is not");
    info.master_addr = addr;
  } else if (std::getenv("SLURM_PROCID") != nullptr) {
    for (auto [name, field] : {std::pair<const char*, int*>{"SLURM_PROCID", &info.rank},
                               {"SLURM_NTASKS", &info.world_size}, {"SLURM_LOCALID", &info.local_rank}}) {
      if (absl::Status s = ReadIntVar(name, field); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("SLURM_PROCID is set but ", s.message()));
      }
    }
    info.local_world_size = info.world_size;
    if (absl::Status s = ReadIntVar("SLURM_NTASKS_PER_NODE", &info.local_world_size); !s.ok() && !absl::IsNotFound(s)) {
      return s;
    }
    const char* nodes = std::getenv("SLURM_JOB_NODELIST");
    if (nodes == nullptr) nodes = std::getenv("SLURM_NODELIST");
    info.master_addr = std::getenv("MASTER_ADDR") != nullptr ? std::getenv("MASTER_ADDR")
                       : nodes != nullptr                    ? FirstSlurmHost(nodes)
                                                             : "127.0.0.1";
    if (absl::Status s = ReadIntVar("MASTER_PORT", &info.master_port); !s.ok() && !absl::IsNotFound(s)) return s;
  } else {
    return std::optional<RankInfo>();
  }
  if (info.rank >= info.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", info.rank, " is not below world size ", info.world_size, " (check RANK / SLURM_PROCID)"));
  }
  return std::optional<RankInfo>(info);
}

absl::StatusOr<std::unique_ptr<Collectives>> CreateCollectives(const RankInfo& info, CollectiveBackend backend,
                                                               absl::Duration timeout) {
  if (backend == CollectiveBackend::kEmulated) return std::unique_ptr<Collectives>(new EmulatedCollectives(info));
#ifndef USE_C10D_NCCL
  if (backend == CollectiveBackend::kNccl) {
    return absl::UnimplementedError("this zrun was built without NCCL; use Gloo or emulated ranks");
  }
#endif
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> group;
  absl::Status status = Guard("rendezvous", [&] {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(info.master_port);
    options.isServer = info.rank == 0;
    options.numWorkers = info.world_size;
    options.timeout = ToChrono(timeout);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
    store = c10::make_intrusive<c10d::PrefixStore>("zrun", tcp);
#ifdef USE_C10D_NCCL
    if (backend == CollectiveBackend::kNccl) {
      // Failures: NCCL work completes asynchronously, so an error or a
      // timeout is seen by ProcessGroupNCCL's watchdog thread, not by wait().
      // Made explicit unless the user chose otherwise: the watchdog takes the
      // rank down (3 = SkipCleanUp, LibTorch's default; the launcher names the
      // SIGABRT), and the error goes through the store to every rank, so the
      // peers of a dead rank end at once instead of each at its own timeout.
      setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", /*overwrite=*/0);
      setenv("TORCH_NCCL_PROPAGATE_ERROR", "1", /*overwrite=*/0);
      // One rank per GPU; the current device was set by the caller.
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = ToChrono(timeout);
      group = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store),
                                                          info.rank, info.world_size, nccl_options);
      return;
    }
#endif
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(ToChrono(timeout));
    // One node: loopback. Several: GLOO_SOCKET_IFNAME or this host's address.
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr) {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (info.local_world_size >= info.world_size) {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store),
                                                        info.rank, info.world_size, gloo_options);
  });
  if (!status.ok()) return status;
  return std::unique_ptr<Collectives>(
      new C10dCollectives(info, store, group, backend == CollectiveBackend::kNccl ? "nccl" : "gloo"));
}

absl::StatusOr<int> FindFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return absl::UnavailableError("cannot bind a port on 127.0.0.1");
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace zplan
