// End-to-end generation benchmark (not a test): prefill tok/s and decode tok/s on a real
// model at several prompt lengths, and the decode step against its memory-bandwidth floor:
// bytes read per decoded token (weights + KV at that length) / measured bandwidth.
//   build/bench/bench_generate [--model PATH] [--lengths 512,2048,8000] [--decode 32]
//                              [--threads 2] [--json FILE]
// Prompts are synthetic (a fixed-seed stream of ordinary token ids): speed does not
// depend on which ids they are.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/sys.h"
#include "kernels/kernels.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

// STREAM-style triad a = b + s*c over arrays far larger than the caches; best of 5, GB/s.
double measure_bandwidth_gbs() {
  const int64_t n = 1 << 25;  // 32M floats = 128 MiB per array
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_seconds();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    const double dt = now_seconds() - t0;
    best = std::max(best, 3.0 * n * sizeof(float) / dt / 1e9);
  }
  if (a[n / 2] != 2.0f) std::fprintf(stderr, "bandwidth check failed\n");
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    out.push_back(std::atoll(s.substr(pos, end - pos).c_str()));
    pos = end + 1;
  }
  return out;
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  using namespace snap;
  std::string model_path = std::getenv("SNAP_MODEL") ? std::getenv("SNAP_MODEL")
                                                      : std::string(std::getenv("HOME")) +
                                                            "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string lengths_arg = "512,2048,8000", json_path, dtype_arg = "f32";
  int decode_tokens = 32, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_path = v;
    else if (k == "--lengths") lengths_arg = v;
    else if (k == "--decode") decode_tokens = std::atoi(v.c_str());
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--json") json_path = v;
    else if (k == "--weight-dtype") dtype_arg = v;
    else {
      std::fprintf(stderr, "bench_generate: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  omp_set_num_threads(threads);
  LoadOptions opts;
  if (dtype_arg == "f16") opts.weight_dtype = DType::f16;
  if (dtype_arg == "bf16") opts.weight_dtype = DType::bf16;
  auto model = load_model(model_path, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "bench_generate: %s\n", model.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = model->config;
  LlamaForward fwd(*model);
  const double bw = measure_bandwidth_gbs();
  const int64_t weight_bytes = model->weights.nbytes() - model->weights.embed.nbytes() +
                               (model->weights.lm_head.empty() ? model->weights.embed.nbytes() : 0);
  std::printf("model %s, weights %s, %d threads, simd %s, measured bandwidth %.1f GB/s (triad)\n",
              c.name.c_str(), dtype_name(opts.weight_dtype), threads, kernels::simd_level_name(), bw);
  std::printf("%8s %12s %12s %14s %16s %14s %8s\n", "prompt", "prefill_tps", "decode_tps", "decode_ms_p50",
              "bytes/token", "floor_ms", "x_floor");
  std::string json = "{\"model\":\"" + c.name + "\",\"threads\":" + std::to_string(threads) +
                     ",\"bandwidth_gbs\":" + std::to_string(bw) + ",\"rows\":[";
  kernels::Rng rng(1234);
  std::vector<float> logits(c.vocab_size);
  bool first = true;
  for (int64_t len : parse_list(lengths_arg)) {
    if (len + decode_tokens > c.max_position) {
      std::fprintf(stderr, "skip %lld: beyond context %lld\n", (long long)len, (long long)c.max_position);
      continue;
    }
    std::vector<int32_t> ids(len);
    for (auto& id : ids) id = 100 + static_cast<int32_t>(rng.next_u64() % (c.vocab_size - 200));
    KvCache cache(fwd.kv_shape());
    cache.reserve(len + decode_tokens);
    double t0 = now_seconds();
    fwd.prefill(ids.data(), len, cache, logits.data(), 512, nullptr);
    const double prefill_s = now_seconds() - t0;
    std::vector<double> steps;
    int32_t next = 200;
    for (int i = 0; i < decode_tokens; ++i) {
      t0 = now_seconds();
      fwd.forward(&next, 1, cache, logits.data(), false);
      steps.push_back(now_seconds() - t0);
      next = 100 + static_cast<int32_t>(rng.next_u64() % 1000);
    }
    const double step = median(steps);
    const int64_t kv_bytes = 2LL * c.num_layers * c.num_kv_heads * c.head_dim * 4 * (len + decode_tokens / 2);
    const double bytes = static_cast<double>(weight_bytes + kv_bytes);
    const double floor_ms = bytes / (bw * 1e9) * 1e3;
    std::printf("%8lld %12.1f %12.1f %14.2f %16.3e %14.2f %8.2f\n", (long long)len, len / prefill_s, 1.0 / step,
                step * 1e3, bytes, floor_ms, step * 1e3 / floor_ms);
    json += std::string(first ? "" : ",") + "{\"prompt_tokens\":" + std::to_string(len) +
            ",\"prefill_tps\":" + std::to_string(len / prefill_s) + ",\"decode_tps\":" + std::to_string(1.0 / step) +
            ",\"decode_ms_p50\":" + std::to_string(step * 1e3) + ",\"bytes_per_token\":" + std::to_string(bytes) +
            ",\"floor_ms\":" + std::to_string(floor_ms) + "}";
    first = false;
  }
  json += "],\"peak_rss_bytes\":" + std::to_string(peak_rss_bytes()) + "}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  std::printf("peak RSS %.1f MiB\n", peak_rss_bytes() / 1048576.0);
  return 0;
}
