// End-to-end generation benchmark (not a test): prefill tok/s, decode ms/token and KV
// memory on a real model at several prompt lengths and KV policies, and the decode step
// against its memory-bandwidth floor: bytes read per decoded token (weights + resident KV)
// / measured bandwidth.
//   build/bench/bench_generate [--model PATH] [--lengths 512,2048,8000] [--decode 32]
//       [--threads 2] [--policies full,snapkv:1024] [--layerwise] [--weight-dtype auto|f32|f16|bf16|q8_0]
//       [--json FILE]
// A policy is NAME[:BUDGET]. Prompts are synthetic (a fixed-seed stream of ordinary token
// ids): speed does not depend on which ids they are.
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/sys.h"
#include "coordinator/engine/generate.h"
#include "kernels/kernels.h"
#include "kernels/matvec_act.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

// STREAM-style triad a = b + s*c over arrays far larger than the caches; best of 5, GB/s.
// Runs in a forked child so its 384 MiB of arrays do not count in this process' peak RSS.
// Call it before this process runs any OpenMP region: libgomp's thread pool does not
// survive fork(), the child would hang.
double measure_bandwidth_gbs_here();
double measure_bandwidth_gbs(int threads) {
  int fds[2];
  if (pipe(fds) != 0) return measure_bandwidth_gbs_here();
  const pid_t pid = fork();
  if (pid == 0) {
    omp_set_num_threads(threads);
    const double bw = measure_bandwidth_gbs_here();
    const ssize_t w = write(fds[1], &bw, sizeof bw);
    _exit(w == sizeof bw ? 0 : 1);
  }
  double bw = 0;
  if (read(fds[0], &bw, sizeof bw) != sizeof bw) bw = 0;
  close(fds[0]);
  close(fds[1]);
  waitpid(pid, nullptr, 0);
  return bw;
}

double measure_bandwidth_gbs_here() {
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

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) out.push_back(s.substr(pos, end - pos));
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
  std::string lengths_arg = "512,2048,8000", policies_arg = "full", json_path;
  int decode_tokens = 32, threads = 2;
  bool layerwise = false;
  std::string weight_format = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--layerwise") {
      layerwise = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_generate: %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (k == "--model") model_path = v;
    else if (k == "--lengths") lengths_arg = v;
    else if (k == "--decode") decode_tokens = std::atoi(v.c_str());
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--policies") policies_arg = v;
    else if (k == "--json") json_path = v;
    else if (k == "--weight-dtype") weight_format = v;
    else {
      std::fprintf(stderr, "bench_generate: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  const double bw = measure_bandwidth_gbs(threads);  // first: before any OpenMP region here
  omp_set_num_threads(threads);
  LoadOptions opts;  // auto: GGUF Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K-Q6_K kept natively; f32/f16/bf16: all dequantized; q8_0: quantized
  if (const Status named = apply_weight_dtype(weight_format, &opts); !named.ok()) {
    std::fprintf(stderr, "bench_generate: %s\n", named.message().c_str());
    return 2;
  }
  auto model = load_model(model_path, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "bench_generate: %s\n", model.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = model->config;
  LlamaForward fwd(*model);
  // Bytes a decode step reads from the weights: every matrix but the embedding table
  // (one row is looked up), plus the LM head (which is the embedding when tied).
  const ModelWeights& w = model->weights;
  const int64_t weight_bytes = w.nbytes() - w.embed.nbytes() + w.output().nbytes() * (w.lm_head.empty() ? 1 : 0);
  std::printf("model %s, weights %s/%s, %d threads, simd %s, matvec %s, weights read per token %.1f MiB, bandwidth %.1f GB/s (triad)\n",
              c.name.c_str(), dtype_name(w.layers[0].q_proj.dtype()), dtype_name(w.output().dtype()), threads,
              kernels::simd_level_name(), kernels::matvec_act_name(kernels::matvec_act()), weight_bytes / 1048576.0, bw);
  std::printf("%-14s %7s %11s %10s %10s %9s %12s %12s %8s %9s %8s\n", "policy", "prompt", "prefill_tps", "decode_ms",
              "decode_tps", "floor_ms", "kv_resident", "kv_full_eq", "ratio", "select_%", "rss_MiB");
  std::string json = "{\"model\":\"" + c.name + "\",\"threads\":" + std::to_string(threads) +
                     ",\"weight_dtype\":\"" + weight_format + "\",\"weight_bytes_per_token\":" +
                     std::to_string(weight_bytes) + ",\"bandwidth_gbs\":" + std::to_string(bw) + ",\"rows\":[";
  bool first = true;
  for (const std::string& pol : split(policies_arg)) {
    KvPolicy policy;
    const size_t colon = pol.find(':');
    auto kind = kv_policy_from_name(pol.substr(0, colon));
    if (!kind.ok()) {
      std::fprintf(stderr, "bench_generate: %s\n", kind.status().message().c_str());
      return 2;
    }
    policy.kind = kind.value();
    if (colon != std::string::npos) policy.budget = std::atoll(pol.c_str() + colon + 1);
    policy.layerwise = layerwise;
    for (const std::string& len_s : split(lengths_arg)) {
      const int64_t len = std::atoll(len_s.c_str());
      if (c.max_position > 0 && len + decode_tokens > c.max_position) {
        std::fprintf(stderr, "skip %lld: beyond the model's context %lld\n", (long long)len, (long long)c.max_position);
        continue;
      }
      kernels::Rng rng(1234);
      GenerateRequest req;
      req.prompt_ids.resize(len);
      for (auto& id : req.prompt_ids) id = 100 + static_cast<int32_t>(rng.next_u64() % (c.vocab_size - 200));
      req.max_tokens = decode_tokens;
      req.kv_policy = policy;
      std::vector<double> stamps;
      GenerateHooks hooks;
      hooks.on_token = [&](int32_t) {
        stamps.push_back(now_seconds());
        return true;
      };
      auto r = generate(fwd, req, hooks);
      if (!r.ok()) {
        std::fprintf(stderr, "bench_generate: %s\n", r.status().message().c_str());
        return 1;
      }
      std::vector<double> steps;
      for (size_t i = 1; i < stamps.size(); ++i) steps.push_back(stamps[i] - stamps[i - 1]);
      const double step = median(steps);
      const GenerateStats& st = r->stats;
      const double bytes = static_cast<double>(weight_bytes + st.kv_resident_bytes);
      const double floor_ms = bytes / (bw * 1e9) * 1e3;
      const double ratio = st.kv_full_equivalent_bytes / std::max<double>(1, st.kv_resident_bytes);
      const double select_pct = 100.0 * st.selection_seconds / std::max(st.prefill_seconds, 1e-9);
      std::printf("%-14s %7lld %11.1f %10.2f %10.1f %9.2f %12lld %12lld %8.2f %9.3f %8.1f\n", pol.c_str(),
                  (long long)len, len / st.prefill_seconds, step * 1e3, 1.0 / step, floor_ms,
                  (long long)st.kv_resident_bytes, (long long)st.kv_full_equivalent_bytes, ratio, select_pct,
                  current_rss_bytes() / 1048576.0);
      std::fflush(stdout);
      json += std::string(first ? "" : ",") + "{\"policy\":\"" + pol + "\",\"prompt_tokens\":" + std::to_string(len) +
              ",\"prefill_tps\":" + std::to_string(len / st.prefill_seconds) +
              ",\"decode_ms_p50\":" + std::to_string(step * 1e3) + ",\"floor_ms\":" + std::to_string(floor_ms) +
              ",\"kv_resident_bytes\":" + std::to_string(st.kv_resident_bytes) +
              ",\"kv_full_equivalent_bytes\":" + std::to_string(st.kv_full_equivalent_bytes) +
              ",\"kv_pool_peak_bytes\":" + std::to_string(st.kv_pool_peak_bytes) +
              ",\"selection_seconds\":" + std::to_string(st.selection_seconds) +
              ",\"prefill_seconds\":" + std::to_string(st.prefill_seconds) + "}";
      first = false;
    }
  }
  json += "],\"peak_rss_bytes\":" + std::to_string(peak_rss_bytes()) + "}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  std::printf("peak RSS %.1f MiB\n", peak_rss_bytes() / 1048576.0);
  return 0;
}
