// The device KV pool's bookkeeping (worker/device/device_kv_pool.h) at real pool sizes: one
// request's life — open, append a prompt to every layer, compact every layer to a SnapKV
// budget, release — on pools of 2^17 to 2^23 blocks (a Llama-3-8B block, 16 tokens of one KV
// head, is 8256 bytes: 2^17 blocks is a 1 GiB pool, 2^20 8 GiB, 2^23 64 GiB), Llama-3-8B's
// 32 layers x 8 KV heads. What grows with the pool is the host's free-list work, so the rows
// use a head_dim of 8: the copies stay small and the blocks' bytes fit any machine (the host
// twin allocates the slabs on the CPU, untouched). Medians of --reps requests, one table row
// per pool size: milliseconds per phase, each ending with the stream synchronised.
//   usage: bench_cuda_kv_pool [--blocks 131072,1048576,8388608] [--tokens 4096] [--budget 1024]
//                             [--reps 5]
// Built for the GPU (device_check.sh runs it) and on the host twin (bench_cuda_kv_pool_host).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/device/device_kv_pool.h"

namespace {

using snap::DeviceKvPool;
using snap::DeviceKvShape;
using snap::Status;

constexpr int k_layers = 32, k_kv_heads = 8, k_head_dim = 8, k_block = 16;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int usage(const char* why) {
  std::fprintf(stderr,
               "bench_cuda_kv_pool: %s\n"
               "usage: bench_cuda_kv_pool [--blocks N,N,...] [--tokens T] [--budget B] [--reps R]\n",
               why);
  return 2;
}

bool parse_int(const char* s, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || v <= 0) return false;
  *out = v;
  return true;
}

template <typename T>
T* device_copy(const std::vector<T>& h) {
  T* p = nullptr;
  if (cudaMalloc(&p, h.size() * sizeof(T)) != cudaSuccess) return nullptr;
  if (cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> blocks{int64_t{1} << 17, int64_t{1} << 20, int64_t{1} << 23};
  int64_t tokens = 4096, budget = 1024, reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    if (a == "--blocks") {
      blocks.clear();
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        int64_t n = 0;
        if (!parse_int(list.substr(at, comma - at).c_str(), &n)) return usage("--blocks: positive integers, comma-separated");
        blocks.push_back(n);
        at = comma + 1;
      }
    } else if (a == "--tokens") {
      if (!parse_int(v, &tokens)) return usage("--tokens: a positive integer");
    } else if (a == "--budget") {
      if (!parse_int(v, &budget)) return usage("--budget: a positive integer");
    } else if (a == "--reps") {
      if (!parse_int(v, &reps)) return usage("--reps: a positive integer");
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  if (budget > tokens) return usage("--budget must not exceed --tokens");
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    std::fprintf(stderr, "bench_cuda_kv_pool: no usable CUDA device\n");
    return 77;
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return 1;

  // The prompt's rows (the same for every layer) and an evenly spread kept list per head.
  std::vector<float> kv(static_cast<size_t>(tokens) * k_kv_heads * k_head_dim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
  std::vector<int32_t> pos(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) pos[t] = static_cast<int32_t>(t);
  float* dk = device_copy(kv);
  int32_t* dpos = device_copy(pos);
  if (dk == nullptr || dpos == nullptr) {
    std::fprintf(stderr, "bench_cuda_kv_pool: cudaMalloc of the prompt's rows failed\n");
    return 1;
  }
  std::vector<std::vector<int32_t>> kept(k_kv_heads);
  for (int g = 0; g < k_kv_heads; ++g)
    for (int64_t i = 0; i < budget; ++i) kept[g].push_back(static_cast<int32_t>(i * tokens / budget));

  std::printf("# device KV pool, one request: %lld-token prompt, %d layers x %d KV heads, compacted to %lld per "
              "head; median of %lld (ms)\n",
              static_cast<long long>(tokens), k_layers, k_kv_heads, static_cast<long long>(budget),
              static_cast<long long>(reps));
  std::printf("| pool blocks | append (all layers) | compact (all layers) | release |\n|---:|---:|---:|---:|\n");
  const DeviceKvShape shape{k_layers, k_kv_heads, k_head_dim, k_block};
  for (const int64_t n : blocks) {
    const int64_t block_bytes = int64_t{k_block} * (2 * k_head_dim * 2 + 4);
    auto made = DeviceKvPool::create(shape, n * block_bytes, stream);
    if (!made.ok()) {
      std::fprintf(stderr, "bench_cuda_kv_pool: %lld blocks: %s\n", static_cast<long long>(n),
                   made.status().to_string().c_str());
      return 1;
    }
    DeviceKvPool& pool = **made;
    std::vector<double> t_append, t_compact, t_release;
    for (int64_t r = 0; r < reps; ++r) {
      const int32_t seq = pool.add_sequence();
      double t0 = now_ms();
      for (int l = 0; l < k_layers; ++l) {
        const Status st = pool.append(seq, l, dk, dk, dpos, tokens);
        if (!st.ok()) {
          std::fprintf(stderr, "bench_cuda_kv_pool: %lld blocks: append: %s\n", static_cast<long long>(n),
                       st.to_string().c_str());
          return 1;
        }
      }
      cudaStreamSynchronize(stream);
      double t1 = now_ms();
      t_append.push_back(t1 - t0);
      for (int l = 0; l < k_layers; ++l) {
        const Status st = pool.compact(seq, l, kept);
        if (!st.ok()) {
          std::fprintf(stderr, "bench_cuda_kv_pool: compact: %s\n", st.to_string().c_str());
          return 1;
        }
      }
      cudaStreamSynchronize(stream);
      t0 = now_ms();
      t_compact.push_back(t0 - t1);
      if (const Status st = pool.release(seq); !st.ok()) {
        std::fprintf(stderr, "bench_cuda_kv_pool: release: %s\n", st.to_string().c_str());
        return 1;
      }
      cudaStreamSynchronize(stream);
      t_release.push_back(now_ms() - t0);
    }
    std::printf("| %lld | %.2f | %.2f | %.2f |\n", static_cast<long long>(n), median(t_append), median(t_compact),
                median(t_release));
    std::fflush(stdout);
  }
  cudaFree(dk);
  cudaFree(dpos);
  cudaStreamDestroy(stream);
  return 0;
}
