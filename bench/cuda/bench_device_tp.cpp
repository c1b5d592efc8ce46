// Tensor-parallel DeviceForward: the cost of the exchange. One process per rank, started as a
// LeaderWorkerSet starts them (--rank R --world-size P --leader HOST:PORT; the TCP communicator,
// no MPI needed), each loading only its shard of a model directory (e.g. a Llama-3-8B-shaped
// random model, tools/make_random_model.py --shape llama3-8b --layers 4) onto --device N
// (default: rank modulo the GPUs). Prefill of --context tokens in 2048-token chunks, then
// --decode greedy steps; rank 0 prints one row: prefill tok/s, decode ms/token, and what the
// exchange cost (calls, payload bytes per decoded token, seconds inside the collectives).
// --exchange host (default) stages through the TCP communicator — how two ranks share one GPU,
// which NCCL refuses; --exchange nccl uses NCCL on device buffers (one GPU per rank). Run
// with --world-size 1 for the TP = 1 row of the same table.
//   usage: bench_device_tp --model DIR --rank R --world-size P --leader HOST:PORT
//                          [--context 32768] [--decode 32] [--exchange host|nccl] [--device N]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "common/host_port.h"
#include "worker/device/device_exchange.h"
#include "worker/device/device_forward.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/model/weights.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int fail(int rank, const std::string& m) {
  std::fprintf(stderr, "bench_device_tp: rank %d: %s\n", rank, m.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace snap;
  std::string model_dir, leader = "127.0.0.1:29600", exchange_kind = "host";
  int rank = 0, world_size = 1, device = -1, decode = 32;
  int64_t context = 32768;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--model" && more) model_dir = argv[++i];
    else if (a == "--rank" && more) rank = std::atoi(argv[++i]);
    else if (a == "--world-size" && more) world_size = std::atoi(argv[++i]);
    else if (a == "--leader" && more) leader = argv[++i];
    else if (a == "--context" && more) context = std::atoll(argv[++i]);
    else if (a == "--decode" && more) decode = std::atoi(argv[++i]);
    else if (a == "--exchange" && more) exchange_kind = argv[++i];
    else if (a == "--device" && more) device = std::atoi(argv[++i]);
    else
      return fail(rank, "unknown or incomplete argument '" + a +
                            "' (usage: --model DIR --rank R --world-size P --leader HOST:PORT [--context N] "
                            "[--decode N] [--exchange host|nccl] [--device N])");
  }
  if (model_dir.empty()) return fail(rank, "--model DIR is required");
  if (exchange_kind != "host" && exchange_kind != "nccl") return fail(rank, "--exchange host or nccl");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_device_tp: no usable GPU; nothing measured\n");
    return 77;
  }
  if (device < 0) device = rank % count;
  cudaSetDevice(device);

  auto world = comm::World::make(rank, world_size);
  if (!world.ok()) return fail(rank, world.status().message());
  auto hp = parse_host_port(leader);
  if (!hp.ok()) return fail(rank, "--leader " + leader + ": " + hp.status().message());
  comm::CommOptions copts;
  copts.leader_host = hp->host;
  copts.port = hp->port;
  copts.rendezvous_timeout = std::chrono::seconds(120);  // the others may still be loading
  copts.device = device;
  std::unique_ptr<comm::Communicator> control, nccl;
  if (world_size > 1) {
    auto c = comm::make_communicator(comm::CommKind::tcp, *world, copts);
    if (!c.ok()) return fail(rank, c.status().message());
    control = std::move(*c);
    if (exchange_kind == "nccl") {
      copts.port = hp->port + 1;
      auto n = comm::make_communicator(comm::CommKind::nccl, *world, copts);
      if (!n.ok()) return fail(rank, n.status().message());
      nccl = std::move(*n);
    }
  }
  comm::Communicator* ex_comm = nccl ? nccl.get() : control.get();

  double t0 = now_s();
  LoadOptions opts;
  opts.keep_quantized = false;
  opts.weight_dtype = DType::bf16;
  opts.tp_rank = rank;
  opts.tp_size = world_size;
  auto model = load_model(model_dir, opts);
  if (!model.ok()) return fail(rank, model.status().to_string());
  auto weights = DeviceWeights::upload(*model);
  if (!weights.ok()) return fail(rank, weights.status().to_string());
  const double load_s = now_s() - t0;
  for (comm::Communicator* cm : {control.get(), nccl.get()})  // every rank has loaded (the first collective agrees)
    if (cm != nullptr) cm->arm_collective_timeout();
  const ModelConfig& c = model->config;
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  const int64_t positions = context + decode + 16;
  const int64_t blocks = int64_t{c.num_layers} * model->shard.num_kv_heads * ((positions + 15) / 16 + 1);
  const int64_t block_bytes = 16 * (4LL * c.head_dim + 4);
  auto pool = DeviceKvPool::create({c.num_layers, model->shard.num_kv_heads, c.head_dim, 16}, blocks * block_bytes, stream);
  if (!pool.ok()) return fail(rank, pool.status().to_string());
  std::unique_ptr<DeviceExchange> exchange;
  if (ex_comm != nullptr) exchange = std::make_unique<DeviceExchange>(*ex_comm, stream);
  double prefill_s = 0, decode_s = 0;
  comm::CommStats after_prefill, after_decode;
  {
    DeviceForward fwd(c, **weights, **pool, exchange.get());
    const int32_t seq = (*pool)->add_sequence();
    std::vector<int32_t> ids(static_cast<size_t>(context));
    for (int64_t i = 0; i < context; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    if (ex_comm) ex_comm->reset_stats();
    cudaDeviceSynchronize();
    t0 = now_s();
    for (int64_t s = 0; s < context; s += 2048) {
      const Status st = fwd.forward(seq, ids.data() + s, std::min<int64_t>(2048, context - s), logits.data(), false, nullptr);
      if (!st.ok()) return fail(rank, st.to_string());
    }
    prefill_s = now_s() - t0;
    if (ex_comm) after_prefill = ex_comm->stats();
    // Greedy decode: every rank feeds the same id (rank 0's argmax reaches the others the way
    // generate sends it: a broadcast of 4 bytes over the control group, timed with the decode).
    int32_t next = 0;
    t0 = now_s();
    for (int d = 0; d < decode; ++d) {
      if (control) {
        const Status b = control->broadcast_bytes(&next, sizeof next, 0);
        if (!b.ok()) return fail(rank, b.to_string());
      }
      const Status st = fwd.forward(seq, &next, 1, nullptr, false, &next);
      if (!st.ok()) return fail(rank, st.to_string());
    }
    decode_s = now_s() - t0;
    if (ex_comm) after_decode = ex_comm->stats();
  }
  (*pool).reset();
  weights->reset();
  cudaStreamDestroy(stream);
  if (rank != 0) return 0;
  const auto ar_pre = after_prefill[comm::CommOp::all_reduce_sum], ag_pre = after_prefill[comm::CommOp::all_gather];
  const auto ar_all = after_decode[comm::CommOp::all_reduce_sum], ag_all = after_decode[comm::CommOp::all_gather];
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  std::printf(
      "device_tp %s: tp %d (%s exchange), %d layers, context %lld: load %.1f s | prefill %.0f tok/s, exchange %.3f s "
      "(%.1f%%) | decode %.2f ms/token, exchange %.3f ms/token (%.0f%%), all_reduce %.0f B + all_gather %.0f B "
      "payload per token\n",
      prop.name, world_size, world_size == 1 ? "no" : exchange_kind.c_str(), c.num_layers,
      static_cast<long long>(context), load_s, context / prefill_s, ar_pre.seconds + ag_pre.seconds,
      100.0 * (ar_pre.seconds + ag_pre.seconds) / prefill_s, 1e3 * decode_s / decode,
      1e3 * (ar_all.seconds + ag_all.seconds - ar_pre.seconds - ag_pre.seconds) / decode,
      100.0 * (ar_all.seconds + ag_all.seconds - ar_pre.seconds - ag_pre.seconds) / decode_s,
      static_cast<double>(ar_all.bytes - ar_pre.bytes) / decode, static_cast<double>(ag_all.bytes - ag_pre.bytes) / decode);
  return 0;
}
