// Single-process backend: a group of one. all_reduce_sum and broadcast leave the buffer
// as it is (the sum over one rank is its own value, already in the buffer's type);
// all_gather copies send to recv; barrier returns at once. Counters still count.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/backends.h"

namespace snap::comm {

namespace {

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(World world) : Communicator(world) {}
  const char* backend_name() const override { return "single"; }

  [[noreturn]] void abort_job(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "snapserve: aborting: %s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(exit_code);
  }

 protected:
  Status do_all_reduce_sum(void*, int64_t, DType) override { return Status(); }
  Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (count > 0 && send != recv) std::memmove(recv, send, count * dtype_size(dtype));
    return Status();
  }
  Status do_broadcast(void*, int64_t, DType, int) override { return Status(); }
  Status do_broadcast_bytes(void*, int64_t, int) override { return Status(); }
  Status do_barrier() override { return Status(); }
};

}  // namespace

namespace detail {

Result<std::unique_ptr<Communicator>> make_single_communicator(const World& world) {
  if (world.tp_size() != 1) {
    return invalid_argument("comm/single: the single-process backend needs tp size 1, got " + world.to_string());
  }
  return std::unique_ptr<Communicator>(std::make_unique<SingleCommunicator>(world));
}

}  // namespace detail
}  // namespace snap::comm
