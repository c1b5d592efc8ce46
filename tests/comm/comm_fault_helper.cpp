// Helper for tests/comm/test_comm_fault.cpp, run under mpirun: 200 rounds of an
// all-reduce of 576 floats. `--fail RANK MODE` makes RANK fail at round 50 by MODE:
// kill (raise SIGKILL), exit (exit code 3 without MPI_Finalize), abort (abort_job) or stop
// (raise SIGSTOP: a rank that hangs without dying) or stopbcast (SIGSTOP after the round's
// all-reduce, before rank 0's broadcast of the next "plan", with broadcasts bounded as
// `generate`'s workers bound them). With stop and stopbcast the collective timeout is 3 s,
// armed as agree_on_load arms it; the other modes keep it unarmed. idbcast: the NCCL backend's
// broadcast of its unique id (comm/backends.h, 2 s limit) instead of the rounds, RANK stopped
// (SIGSTOP) before it (a RANK outside the job: every rank gets the id).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/backends.h"
#include "comm/bootstrap.h"

int main(int argc, char** argv) {
  using namespace snap::comm;
  int fail_rank = -1;
  std::string mode;
  if (argc == 4 && std::strcmp(argv[1], "--fail") == 0) {
    fail_rank = std::atoi(argv[2]);
    mode = argv[3];
  }
  snap::Result<World> world = world_from_environment();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().to_string().c_str());
    return 1;
  }
  CommOptions options;
  options.collective_timeout = std::chrono::seconds(3);
  snap::Result<std::unique_ptr<Communicator>> comm = make_communicator(CommKind::mpi, world.value(), options);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().to_string().c_str());
    return 1;
  }
  if (mode == "idbcast") {
    if (world->rank() == fail_rank) std::raise(SIGSTOP);
    std::vector<uint8_t> id(128, world->rank() == 0 ? 7 : 0);
    const snap::Status s = detail::mpi_broadcast_from_rank0(id.data(), static_cast<int>(id.size()), std::chrono::seconds(2));
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", world->rank(), s.to_string().c_str());
      return 2;
    }
    if (id[0] != 7 || id[127] != 7) {
      std::fprintf(stderr, "rank %d: the id arrived wrong\n", world->rank());
      return 3;
    }
    if (world->is_leader()) std::printf("comm_fault_helper: id broadcast done\n");
    return 0;
  }
  if (mode == "stop" || mode == "stopbcast") comm.value()->arm_collective_timeout();
  if (mode == "stopbcast") comm.value()->bound_broadcasts(Communicator::BroadcastBound::step);
  std::vector<uint8_t> plan(64);
  std::vector<float> act(576);
  for (int round = 0; round < 200; ++round) {
    if (round == 50 && world->rank() == fail_rank) {
      if (mode == "kill") std::raise(SIGKILL);
      if (mode == "exit") std::_Exit(3);
      if (mode == "abort") comm.value()->abort_job("worker failed on purpose in round 50", 5);
      if (mode == "stop") std::raise(SIGSTOP);
    }
    for (size_t i = 0; i < act.size(); ++i) act[i] = static_cast<float>(world->rank() + i);
    snap::Status s = comm.value()->all_reduce_sum(std::span<float>(act));
    if (s.ok() && mode == "stopbcast") {
      if (round == 50 && world->rank() == fail_rank) std::raise(SIGSTOP);
      s = comm.value()->broadcast_bytes(plan.data(), static_cast<int64_t>(plan.size()), 0);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", world->rank(), s.to_string().c_str());
      return 2;
    }
  }
  if (world->is_leader()) std::printf("comm_fault_helper: 200 rounds done\n");
  comm.value().reset();
  return 0;
}
