// End-to-end DeviceForward benchmark on one GPU: a model directory (e.g. a Llama-3-8B-shaped
// random model with fewer layers, tools/make_random_model.py --shape llama3-8b --layers 4)
// loaded as bf16, uploaded, then per context length: prefill in 2048-token chunks (tok/s)
// and greedy decode (ms/token, device argmax) with the full cache, then the same prompt with
// SnapKV (budget 2048, window 32, on the device: compress_snapkv) and its decode. The
// 32-layer figures are the measured ones scaled by 32 / layers — an estimate that counts the
// LM head 32/layers times, so it overstates the time; say so when quoting it.
// The HBM floor of a decode step: (weight bytes + the K/V bytes the step reads) / the device
// bandwidth measured here (a 1 GiB device-to-device copy, read + write counted); the goal is
// measured / floor <= 1.5. Then the same contexts through the DeviceGenerator — what
// `snapserve generate --device cuda` runs (host sampling loop, greedy on the device) — full
// and snapkv 2048, decode ms/token from its own stats.
// With --layerwise-contexts N1,N2,...: layer-wise prefill + SnapKV 2048 through the generator at
// each N (ascending, until one fails or --time-budget seconds have passed): prefill tok/s, the
// pool's peak and the device memory in use, decode ms/token, and the memory model that says how
// far this device would go: per prompt token one layer's K/V (num_kv_heads blocks' worth) + its
// f32 hidden state, on top of the weights and every layer's compressed 2048 + decode entries.
// With --batches B1,B2,...: continuous batching, B sequences of --batch-prompt tokens (2048,
// SnapKV's budget) decoding together
// through decode_batch (ms per step, tokens/s), each layer's appends and attention one launch for
// all B rows against one per row (DeviceForward::set_batched_rows; the same bits).
// With --contexts-budget S, a context of the first two tables runs only if its predicted time
// (the last one's, grown ~n^2 by attention, for both tables) fits in what is left of S seconds.
// --weight-dtype q8_0 loads the weights as --weight-dtype q8_0 does (Q8_0 on the device: the
// floor counts their bytes).
//   usage: bench_device_forward --model DIR [--contexts 8192,32768] [--decode 16]
//                               [--contexts-budget 0] [--layerwise-contexts 131072,524288]
//                               [--time-budget 240] [--batches 1,8,32,64] [--batch-prompt 2048]
//                               [--weight-dtype bf16|q8_0]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/engine/device_spec.h"
#include "worker/device/device_forward.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/model/weights.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int fail(const std::string& m) {
  std::fprintf(stderr, "bench_device_forward: %s\n", m.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  std::vector<int64_t> contexts{8192, 32768};
  int decode = 16;
  std::vector<int64_t> layerwise_contexts;
  std::vector<int64_t> batches;
  int64_t batch_prompt = 2048;
  double time_budget = 240;
  double contexts_budget = 0;  // 0: no limit
  std::string weight_dtype = "bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model_dir = argv[++i];
    } else if (a == "--contexts" && i + 1 < argc) {
      contexts.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) contexts.push_back(std::atoll(t.c_str()));
    } else if (a == "--decode" && i + 1 < argc) {
      decode = std::atoi(argv[++i]);
    } else if (a == "--layerwise-contexts" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) layerwise_contexts.push_back(std::atoll(t.c_str()));
    } else if (a == "--batches" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) batches.push_back(std::atoll(t.c_str()));
    } else if (a == "--batch-prompt" && i + 1 < argc) {
      batch_prompt = std::atoll(argv[++i]);
    } else if (a == "--time-budget" && i + 1 < argc) {
      time_budget = std::atof(argv[++i]);
    } else if (a == "--contexts-budget" && i + 1 < argc) {
      contexts_budget = std::atof(argv[++i]);
    } else if (a == "--weight-dtype" && i + 1 < argc) {
      weight_dtype = argv[++i];
      if (weight_dtype != "bf16" && weight_dtype != "q8_0") return fail("--weight-dtype takes bf16 or q8_0");
    } else {
      return fail("unknown or incomplete argument '" + a +
                  "' (usage: --model DIR [--contexts 8192,32768] [--decode 16] [--contexts-budget S] "
                  "[--layerwise-contexts N,...] [--time-budget S] [--batches B,...] [--batch-prompt N] "
                  "[--weight-dtype bf16|q8_0])");
    }
  }
  if (model_dir.empty()) return fail("--model DIR is required");
  for (int64_t b : batches)
    if (b < 1) return fail("--batches takes positive batch sizes, got " + std::to_string(b));
  if (batch_prompt < 1) return fail("--batch-prompt must be positive");
  if (decode < 1) return fail("--decode must be positive");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_device_forward: no usable GPU; nothing measured\n");
    return 77;
  }

  double t0 = now_s();
  snap::LoadOptions opts;
  opts.keep_quantized = false;
  opts.matvec_tiles = false;  // the device reads row-major blocks
  opts.weight_dtype = weight_dtype == "q8_0" ? snap::DType::q8_0 : snap::DType::bf16;
  auto model = snap::load_model(model_dir, opts);
  if (!model.ok()) return fail(model.status().to_string());
  const double load_s = now_s() - t0;
  t0 = now_s();
  auto weights = snap::DeviceWeights::upload(*model);
  if (!weights.ok()) return fail(weights.status().to_string());
  const double upload_s = now_s() - t0;
  const snap::ModelConfig& c = model->config;
  std::printf("bench_device_forward: %s: %d layers, hidden %lld, %d/%d heads, vocab %lld; weights %.2f GB %s on device "
              "(load %.1f s, upload %.1f s)\n",
              model_dir.c_str(), c.num_layers, static_cast<long long>(c.hidden_size), c.num_heads, c.num_kv_heads,
              static_cast<long long>(c.vocab_size), (*weights)->bytes / 1e9, weight_dtype.c_str(), load_s, upload_s);

  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) return fail("cudaStreamCreate failed");
  // Device bandwidth: 1 GiB copied device to device, best of 5, read + write bytes.
  double bw = 0;
  {
    const size_t bytes = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return fail("cudaMalloc 2 GiB");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int r = 0; r < 6; ++r) {
      cudaEventRecord(e0, stream);
      cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
      cudaEventRecord(e1, stream);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (r > 0) bw = std::max(bw, 2.0 * bytes / (ms * 1e-3));  // the first warms up
    }
    cudaFree(a);
    cudaFree(b);
  }
  std::printf("  device-to-device bandwidth %.0f GB/s (read + write)\n", bw / 1e9);
  // Bytes one decode step reads: every weight once + K and V of `kv_len` entries per head.
  const auto floor_ms = [&](int64_t kv_len) {
    const double kv = 2.0 * c.num_layers * c.num_kv_heads * kv_len * c.head_dim * 2;
    return ((*weights)->bytes + kv) / bw * 1e3;
  };
  int64_t max_ctx = 0;
  for (int64_t x : contexts) max_ctx = std::max(max_ctx, x);
  const int64_t kv_tokens = max_ctx + decode + 64;
  const int64_t pool_bytes = (kv_tokens + 16) * c.num_layers * c.num_kv_heads * (2 * c.head_dim * 2 + 4) * 11 / 10;
  auto pool = snap::DeviceKvPool::create({c.num_layers, c.num_kv_heads, c.head_dim, 16}, pool_bytes, stream);
  if (!pool.ok()) return fail(pool.status().to_string());
  snap::DeviceForward fwd(c, **weights, **pool);
  std::printf("  prompt attention: %s (SNAP_DEVICE_PROMPT_ATTENTION=tc|mma|mma_bf16|wmma|f32; tc = mma, the default); "
              "decode attention: %s (SNAP_DEVICE_DECODE_ATTENTION=key_threads|pipelined|row_warps)\n",
              fwd.prompt_attention_name().c_str(), snap::DeviceForward::decode_attention_name(fwd.decode_attention()));

  std::printf("  %-8s %13s %12s %12s %12s %14s %14s %11s %11s\n", "context", "prefill tok/s", "full ms/tok",
              "snapkv ms/tok", "select ms", "full x32/L", "snapkv x32/L", "full/floor", "snapkv/floor");
  snap::kernels::SnapKvCudaParams sp;  // budget 2048; the defaults: window 32, avg pooling kernel 31, mean over the group
  sp.budget = 2048;
  std::sort(contexts.begin(), contexts.end());
  std::vector<int64_t> ran;  // the contexts the first table measured; the second runs the same
  const double t_contexts = now_s();
  double last_ctx = 0, last_ctx_s = 0;
  for (int64_t ctx : contexts) {
    const double predicted = last_ctx > 0 ? last_ctx_s * (ctx / last_ctx) * (ctx / last_ctx) : 0;
    if (contexts_budget > 0 && now_s() - t_contexts + 2 * predicted > contexts_budget) {
      std::printf("  %-8lld skipped: ~%.0f s predicted for both tables, over what is left of --contexts-budget %.0f s\n",
                  static_cast<long long>(ctx), 2 * predicted, contexts_budget);
      break;
    }
    const double t_ctx = now_s();
    std::vector<int32_t> ids(static_cast<size_t>(ctx));
    for (int64_t i = 0; i < ctx; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    double prefill_s = 0, ms[2] = {0, 0}, select_ms = 0;
    for (int snapkv = 0; snapkv < 2; ++snapkv) {  // the same prompt with the full cache, then with SnapKV
      const int32_t seq = (*pool)->add_sequence();
      int32_t next = 0;
      fwd.observe_window(snapkv ? sp.window : 0);
      t0 = now_s();
      for (int64_t at = 0; at < ctx; at += 2048) {
        const int64_t n = std::min<int64_t>(2048, ctx - at);
        const snap::Status st = fwd.forward(seq, ids.data() + at, n, nullptr, false, &next);
        if (!st.ok()) return fail("prefill at " + std::to_string(at) + ": " + st.to_string());
      }
      if (!snapkv) prefill_s = now_s() - t0;
      if (snapkv) {
        t0 = now_s();
        const snap::Status st = fwd.compress_snapkv(seq, sp);
        if (!st.ok()) return fail("snapkv: " + st.to_string());
        select_ms = (now_s() - t0) * 1e3;
      }
      t0 = now_s();
      for (int s = 0; s < decode; ++s) {
        const int32_t tok = next;
        const snap::Status st = fwd.forward(seq, &tok, 1, nullptr, false, &next);
        if (!st.ok()) return fail("decode: " + st.to_string());
      }
      ms[snapkv] = (now_s() - t0) * 1e3 / std::max(decode, 1);
      const snap::Status st = (*pool)->release(seq);
      if (!st.ok()) return fail(st.to_string());
    }
    const double scale = 32.0 / c.num_layers;
    const int64_t mid = decode / 2;  // the average KV length over the decode steps
    std::printf("  %-8lld %13.0f %12.2f %12.2f %12.1f %14.2f %14.2f %11.2f %11.2f\n", static_cast<long long>(ctx),
                ctx / prefill_s, ms[0], ms[1], select_ms, ms[0] * scale, ms[1] * scale, ms[0] / floor_ms(ctx + mid),
                ms[1] / floor_ms(std::min<int64_t>(ctx, sp.budget) + mid));
    std::fflush(stdout);
    ran.push_back(ctx);
    last_ctx = static_cast<double>(ctx);
    last_ctx_s = now_s() - t_ctx;
  }
  std::printf("  device scratch %.1f MB, KV pool %.2f GB\n", fwd.scratch_bytes() / 1e6, pool_bytes / 1e9);

  // The generate path (DeviceGenerator): the same prompts, full and snapkv 2048.
  snap::DeviceSpec spec;
  spec.kind = snap::DeviceKind::cuda;
  auto gen = snap::open_device_generator(spec, *model);
  if (!gen.ok()) return fail(gen.status().to_string());
  std::printf("  generate --device cuda (DeviceGenerator): decode ms/token, %d tokens after the prompt\n", decode);
  std::printf("  %-8s %12s %12s %14s\n", "context", "full ms/tok", "snapkv ms/tok", "snapkv KV x");
  for (int64_t ctx : ran) {
    snap::GenerateRequest req;
    for (int64_t i = 0; i < ctx; ++i) req.prompt_ids.push_back(static_cast<int32_t>((i * 7919 + 13) % c.vocab_size));
    req.max_tokens = decode + 1;
    req.prefill_chunk = 2048;
    req.context_limit = ctx + decode + 1;
    double gms[2] = {0, 0}, ratio = 0;
    for (int snapkv = 0; snapkv < 2; ++snapkv) {
      req.kv_policy.kind = snapkv ? snap::KvPolicyKind::snapkv : snap::KvPolicyKind::full;
      req.kv_policy.budget = 2048;
      auto r = (*gen)->generate(req, {});
      if (!r.ok()) return fail("generate at " + std::to_string(ctx) + ": " + r.status().to_string());
      gms[snapkv] = r->stats.decode_seconds * 1e3 / std::max<int64_t>(r->stats.generated_tokens - 1, 1);
      if (snapkv) ratio = static_cast<double>(r->stats.kv_full_equivalent_bytes) / std::max<int64_t>(r->stats.kv_resident_bytes, 1);
    }
    std::printf("  %-8lld %12.2f %12.2f %14.1f\n", static_cast<long long>(ctx), gms[0], gms[1], ratio);
    std::fflush(stdout);
  }
  std::printf("  %s\n", (*gen)->describe_memory().c_str());

  // Continuous batching: B sequences of --batch-prompt tokens (SnapKV's budget) decoding together through
  // decode_batch, each layer's appends and attention in one launch each, against one launch per
  // sequence (set_batched_rows(false): the same bits). Greedy ids on the device, none to the host.
  if (!batches.empty()) {
    const int64_t most = *std::max_element(batches.begin(), batches.end()), prompt = batch_prompt;
    const int64_t steps = 2 * static_cast<int64_t>(batches.size()) * (decode + 1) + 16;  // per sequence, at most
    const int64_t bpool = most * ((prompt + steps) / 16 + 2) * c.num_layers * c.num_kv_heads * 16 * (2 * c.head_dim * 2 + 4);
    auto pool2 = snap::DeviceKvPool::create({c.num_layers, c.num_kv_heads, c.head_dim, 16}, bpool, stream);
    if (!pool2.ok()) return fail(pool2.status().to_string());
    snap::DeviceForward bfwd(c, **weights, **pool2);
    std::vector<int32_t> seqs, toks;
    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    for (int64_t s = 0; s < most; ++s) {
      for (int64_t i = 0; i < prompt; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13 * s + 13) % c.vocab_size);
      seqs.push_back((*pool2)->add_sequence());
      toks.push_back(0);
      const snap::Status st = bfwd.forward(seqs.back(), ids.data(), prompt, nullptr, false, &toks.back());
      if (!st.ok()) return fail("batch prefill: " + st.to_string());
    }
    std::printf("  continuous batching: B sequences of %lld tokens, %d decode steps (decode_batch, greedy on the device)\n",
                static_cast<long long>(prompt), decode);
    // A step's floor: the weights once + every sequence's K/V (its prompt and the steps so far).
    std::printf("  %-5s %18s %18s %12s %16s %14s\n", "B", "step ms (1 launch)", "step ms (per row)", "per row / 1",
                "tok/s (1 launch)", "1 launch/floor");
    for (int64_t b : batches) {
      double step_ms[2] = {0, 0};
      for (int batched = 1; batched >= 0; --batched) {
        bfwd.set_batched_rows(batched == 1);
        std::vector<int32_t> next(static_cast<size_t>(b));
        snap::Status st = bfwd.decode_batch(seqs.data(), toks.data(), b, nullptr, next.data());  // warm-up
        t0 = now_s();
        for (int s = 0; s < decode && st.ok(); ++s) {
          std::copy(next.begin(), next.end(), toks.begin());
          st = bfwd.decode_batch(seqs.data(), toks.data(), b, nullptr, next.data());
        }
        if (!st.ok()) return fail("decode_batch of " + std::to_string(b) + ": " + st.to_string());
        step_ms[batched] = (now_s() - t0) * 1e3 / decode;
      }
      double entries = 0;  // K/V entries per (layer, KV head), summed over the step's sequences
      for (int64_t i = 0; i < b; ++i) entries += static_cast<double>((*pool2)->appended(seqs[i], 0));
      const double kv = 2.0 * c.num_layers * c.num_kv_heads * entries * c.head_dim * 2;
      const double floor = ((*weights)->bytes + kv) / bw * 1e3;
      std::printf("  %-5lld %18.2f %18.2f %12.2f %16.0f %14.2f\n", static_cast<long long>(b), step_ms[1], step_ms[0],
                  step_ms[0] / step_ms[1], b / (step_ms[1] * 1e-3), step_ms[1] / floor);
      std::fflush(stdout);
    }
  }
  if (layerwise_contexts.empty()) return 0;  // the stream, pool and weights go with the process

  // Layer-wise prefill + SnapKV 2048: how long a prompt this device holds.
  const int64_t bs = 16, block = bs * (2 * c.head_dim * 2 + 4);  // device KV block bytes
  const double per_token = static_cast<double>(c.num_kv_heads) * block / bs + 4.0 * c.hidden_size;
  const int64_t kept_blocks = int64_t{c.num_layers} * c.num_kv_heads * ((2048 + decode + 2 * bs) / bs + 1);
  const int64_t weight_bytes = (*weights)->bytes;  // the generator holds its own copy
  pool->reset();     // the benchmark's pool and weights are not needed any more
  weights->reset();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  std::printf("  layer-wise prefill + snapkv 2048 (memory model: %.1f KB per prompt token = one layer's K/V %.1f KB + "
              "the f32 hidden state %.1f KB; compressed layers %.2f GB; %.1f GB free now -> about %.2fM tokens, "
              "before activations and workspaces)\n",
              per_token / 1e3, static_cast<double>(c.num_kv_heads) * block / bs / 1e3, 4.0 * c.hidden_size / 1e3,
              kept_blocks * block / 1e9, free_b / 1e9, (free_b - kept_blocks * static_cast<double>(block)) / per_token / 1e6);
  std::printf("  %-9s %13s %11s %11s %13s %11s %14s %8s\n", "prompt", "prefill tok/s", "pool GB", "KV peak GB",
              "scratch GB", "held GB", "snapkv ms/tok", "KV x");
  std::fflush(stdout);
  const double t_start = now_s();
  std::sort(layerwise_contexts.begin(), layerwise_contexts.end());
  double last_n = 0, last_s = 0;  // attention makes prefill time grow ~ n^2: predict the next one
  for (int64_t n : layerwise_contexts) {
    const double predicted = last_n > 0 ? last_s * (n / last_n) * (n / last_n) : 0;
    if (now_s() - t_start + predicted > time_budget) {
      std::printf("  %-9lld skipped: ~%.0f s predicted, over what is left of the %.0f s budget\n",
                  static_cast<long long>(n), predicted, time_budget);
      break;
    }
    const double t_req = now_s();
    snap::GenerateRequest req;
    for (int64_t i = 0; i < n; ++i) req.prompt_ids.push_back(static_cast<int32_t>((i * 7919 + 13) % c.vocab_size));
    req.max_tokens = decode + 1;
    req.prefill_chunk = 4096;
    req.context_limit = n + decode + 1;
    req.kv_policy.kind = snap::KvPolicyKind::snapkv;
    req.kv_policy.budget = 2048;
    req.kv_policy.layerwise = true;
    // One layer's full KV + the compressed layers (+ a block per head of slack), not every layer's.
    req.kv_pool_bytes = (int64_t{c.num_kv_heads} * ((n + decode) / bs + 2) + kept_blocks) * block;
    auto r = (*gen)->generate(req, {});
    if (!r.ok()) {
      std::printf("  %-9lld failed: %s\n", static_cast<long long>(n), r.status().message().c_str());
      break;
    }
    const double ratio = static_cast<double>(r->stats.kv_full_equivalent_bytes) / std::max<int64_t>(r->stats.kv_resident_bytes, 1);
    // held = weights + the pool as allocated + the scratch at its largest (hidden states included):
    // the device memory this request needed, cuBLAS's own workspace aside.
    const double held = static_cast<double>(weight_bytes + req.kv_pool_bytes + r->stats.scratch_peak_bytes);
    std::printf("  %-9lld %13.0f %11.2f %11.2f %13.2f %11.2f %14.2f %8.1f\n", static_cast<long long>(n),
                n / r->stats.prefill_seconds, req.kv_pool_bytes / 1e9, r->stats.kv_pool_peak_bytes / 1e9,
                r->stats.scratch_peak_bytes / 1e9, held / 1e9,
                r->stats.decode_seconds * 1e3 / std::max<int64_t>(r->stats.generated_tokens - 1, 1), ratio);
    std::fflush(stdout);  // a row survives a timeout that kills a longer prompt
    last_n = static_cast<double>(n);
    last_s = now_s() - t_req;
  }
  return 0;
}
