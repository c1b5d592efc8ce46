// Decode matvec benchmark (not a test): one decode token's matvecs over a SmolLM2-135M-shaped
// stack of random block weights (30 layers × q/k/v/o/gate/up/down + the 49152×576 q8_0 LM
// head, 92 MiB for q4_1, far beyond the caches, as in a real decode step; --hidden/--kv/--ff
// change the layer shape, e.g. for the K formats' 256-weight blocks), timed per pass,
// against the memory-bandwidth floor: bytes of weights / measured bandwidth (STREAM triad and
// a read-only sum, both over 3 × 128 MiB). The --acts modes (kernels/matvec_act.h) run
// interleaved round by round, so a noisy machine shifts both alike; medians are quoted.
// A mode with "+vnni" (q16act+vnni, q16x2act+vnni) runs the AVX-512 VNNI tiles of
// kernels/cpu/matvec_q16act_vnni.cpp, the plain name the AVX2 tiles (on a CPU without AVX-512
// VNNI, "+vnni" is refused).
//   build/bench/bench_matvec [--threads 2] [--dtypes q4_1,q4_0,q8_0] [--acts f32act,q8act,q16act,q16x2act,q8x3act]
//       [--rounds 15] [--tokens 1] [--layers 30] [--hidden 576 --kv 192 --ff 1536]
//   e.g. the K formats against f32 at a 1024-wide shape:
//   build/bench/bench_matvec --dtypes f32,q4_k,q6_k,q5_k,q3_k,q2_k,q4_0 --acts f32act --hidden 1024 --kv 256 --ff 4096 --layers 16
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/sys.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matvec_q16act.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/matvec_act.h"
#include "kernels/weight_tiles.h"

namespace snap {
namespace {

// The instructions q8x3act's tiles use here (the bench sets each mode itself afterwards).
const char* q8x3_tiles_name() {
  const snap::kernels::MatvecAct was = snap::kernels::matvec_act();
  snap::kernels::matvec_act_set(snap::kernels::MatvecAct::q8x3);
  const char* name = snap::kernels::matvec_act_tiles_name();
  snap::kernels::matvec_act_set(was);
  return name;
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

// GB/s, best of 5: triad a = b + s·c (3 arrays moved) and a read-only sum of 3 arrays.
struct Bandwidth {
  double triad = 0, read = 0;
};
Bandwidth measure_bandwidth() {
  const int64_t n = 1 << 25;  // 32M floats = 128 MiB per array
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  Bandwidth bw;
  for (int rep = 0; rep < 5; ++rep) {
    double t0 = now_seconds();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    bw.triad = std::max(bw.triad, 3.0 * n * sizeof(float) / (now_seconds() - t0) / 1e9);
    // The read probe sums the arrays' bits as integers: integer adds vectorize without
    // reassociation flags (a float sum would be bound by its add latency, not by memory).
    const auto* ua = reinterpret_cast<const uint32_t*>(a.data());
    const auto* ub = reinterpret_cast<const uint32_t*>(b.data());
    const auto* uc = reinterpret_cast<const uint32_t*>(c.data());
    t0 = now_seconds();
    uint32_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += ua[i] + ub[i] + uc[i];
    bw.read = std::max(bw.read, 3.0 * n * sizeof(float) / (now_seconds() - t0) / 1e9);
    const uint32_t one = 0x3f800000u, two = 0x40000000u;  // bits of 1.0f, 2.0f (a = 2)
    if (sum != static_cast<uint32_t>(n) * (two + one + two)) std::fprintf(stderr, "bandwidth check failed\n");
  }
  return bw;
}

// Random weights with finite scales (the values do not matter for speed, only the bytes): floats
// in [-0.05, 0.05], or random block bytes with every block's f16 d (and its m or dmin) set.
std::vector<uint8_t> random_blocks(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> data(static_cast<size_t>(rows * dtype_row_bytes(dtype, cols)));
  if (dtype == DType::f32) {
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    for (size_t i = 0; i < data.size(); i += 4) {
      const float v = u(rng);
      std::memcpy(&data[i], &v, 4);
    }
    return data;
  }
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const size_t d_at = dtype == DType::q6_k ? 208 : dtype == DType::q3_k ? 108 : dtype == DType::q2_k ? 80 : 0;
  const bool has_min = dtype == DType::q4_1 || dtype == DType::q5_1 || dtype == DType::q4_k || dtype == DType::q5_k ||
                       dtype == DType::q2_k;
  for (size_t off = 0; off < data.size(); off += static_cast<size_t>(dtype_block_bytes(dtype))) {
    const uint16_t d = f32_to_f16(dtype_block_elems(dtype) == 256 ? 0.001f : 0.01f), m = f32_to_f16(-0.05f);
    std::memcpy(&data[off + d_at], &d, 2);
    if (has_min) std::memcpy(&data[off + d_at + 2], &m, 2);
  }
  return data;
}

// A --dtypes name: f32 or a block format (common/dtype.h's names).
bool weight_dtype_of(const std::string& name, DType* out) {
  for (int i = 0; i <= static_cast<int>(DType::q2_k); ++i) {
    const DType d = static_cast<DType>(i);
    if ((d == DType::f32 || dtype_is_quantized(d)) && name == dtype_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

struct Mat {
  std::vector<uint8_t> bytes;
  kernels::WeightView view;
};

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  using namespace snap;
  int threads = 2, rounds = 15, layers = 30;
  int64_t tokens = 1, hidden = 576, kv = 192, ff = 1536;
  std::string dtypes_arg = "q4_1,q4_0,q8_0", acts_arg = "f32act,q8act,q16act,q16x2act,q8x3act";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf(
          "bench_matvec: one decode token's matvecs over a SmolLM2-135M-shaped weight stack vs the bandwidth floor\n"
          "  --threads N       OpenMP threads (2)\n"
          "  --dtypes LIST     layer weight types: f32 or block formats (q4_1,q4_0,q8_0,q5_0,q5_1,q4_k,q5_k,q6_k,q3_k,\n"
          "                    q2_k; default q4_1,q4_0,q8_0); the LM head is q8_0. Q5_0/Q5_1 and the K\n"
          "                    formats run q16x2act under q8act/q8x3act (kernels/matvec_act.h)\n"
          "  --acts LIST       matvec activation modes among f32act,q8act,q16act,q16x2act,q8x3act (all), interleaved per round;\n"
          "                    q16act+vnni / q16x2act+vnni: the AVX-512 VNNI tiles (the plain names: AVX2 tiles);\n"
          "                    MODE+tiles: the weights in the 4-row tiles the loader makes for q8x3act (AVX2/AVX-512)\n"
          "                    (kernels/weight_tiles.h; the plain names: row-major blocks)\n"
          "  --rounds N        timed passes per mode (15); the median is printed\n"
          "  --tokens N        rows per matvec call (1: one decode token)\n"
          "  --layers N        transformer layers in the stack (30, as SmolLM2-135M)\n"
          "  --hidden H --kv K --ff F   a layer's widths (576, 192, 1536: SmolLM2-135M); the K formats need\n"
          "                    multiples of 256 (e.g. 1024, 256, 4096)\n"
          "Env SNAP_SIMD=avx2 runs the AVX2 tiles on an AVX-512 CPU; SNAP_AVXVNNI=0 makes q8x3act's AVX2 tiles\n"
          "use vpmaddubsw + vpmaddwd instead of AVX-VNNI (what an AVX2 CPU without AVX-VNNI runs).\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_matvec: %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--dtypes") dtypes_arg = v;
    else if (k == "--acts") acts_arg = v;
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else if (k == "--tokens") tokens = std::atoll(v.c_str());
    else if (k == "--layers") layers = std::atoi(v.c_str());
    else if (k == "--hidden") hidden = std::atoll(v.c_str());
    else if (k == "--kv") kv = std::atoll(v.c_str());
    else if (k == "--ff") ff = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "bench_matvec: unknown flag %s (see --help)\n", k.c_str());
      return 2;
    }
  }
  if (threads < 1 || rounds < 1 || tokens < 1 || layers < 1) {
    std::fprintf(stderr, "bench_matvec: --threads, --rounds, --tokens and --layers must be >= 1\n");
    return 2;
  }
  if (hidden < 32 || kv < 32 || ff < 32 || hidden % 32 || kv % 32 || ff % 32) {
    std::fprintf(stderr, "bench_matvec: --hidden, --kv and --ff must be positive multiples of 32\n");
    return 2;
  }
  std::vector<kernels::MatvecAct> acts;
  std::vector<bool> vnni, tiled;
  for (std::string a : split(acts_arg)) {
    const std::string tiles_suffix = "+tiles";
    const bool t = a.size() > tiles_suffix.size() &&
                   a.compare(a.size() - tiles_suffix.size(), tiles_suffix.size(), tiles_suffix) == 0;
    if (t) a.resize(a.size() - tiles_suffix.size());
    tiled.push_back(t);
    const std::string suffix = "+vnni";
    const bool v = a.size() > suffix.size() && a.compare(a.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (v) a.resize(a.size() - suffix.size());
    kernels::MatvecAct act;
    if (!kernels::matvec_act_from_name(a, &act) ||
        (v && act != kernels::MatvecAct::q16 && act != kernels::MatvecAct::q16x2)) {
      std::fprintf(stderr,
                   "bench_matvec: unknown activation mode '%s%s' (f32act|q8act|q16act|q16x2act|q8x3act|q16act+vnni|q16x2act+vnni, "
                   "each also +tiles)\n",
                   a.c_str(), v ? suffix.c_str() : "");
      return 2;
    }
    if (v && !(kernels::simd_level() == kernels::SimdLevel::avx512 && kernels::q16act_vnni_supported())) {
      std::fprintf(stderr, "bench_matvec: %s+vnni needs AVX-512 VNNI (simd %s here)\n", a.c_str(),
                   kernels::simd_level_name());
      return 2;
    }
    acts.push_back(act);
    vnni.push_back(v);
  }
  omp_set_num_threads(threads);
  const Bandwidth bw = measure_bandwidth();
  std::printf("threads %d, simd %s, q8x3act tiles %s, tokens %lld, bandwidth triad %.1f GB/s, read %.1f GB/s\n",
              threads, kernels::simd_level_name(), q8x3_tiles_name(), (long long)tokens, bw.triad, bw.read);
  std::printf("%-6s %-13s %9s %10s %8s %10s %10s\n", "dtype", "act", "MiB", "ms/token", "GB/s", "x_triad", "x_read");
  // [rows, cols] of one layer: q, k, v, o, gate, up, down.
  const int64_t shapes[7][2] = {{hidden, hidden}, {kv, hidden}, {kv, hidden}, {hidden, hidden},
                                {ff, hidden},     {ff, hidden}, {hidden, ff}};
  for (const std::string& name : split(dtypes_arg)) {
    DType dtype;
    if (!weight_dtype_of(name, &dtype)) {
      std::fprintf(stderr, "bench_matvec: unknown weight type '%s' (f32 or a block format: see --help)\n", name.c_str());
      return 2;
    }
    const int64_t per = dtype_block_elems(dtype);
    if (hidden % per || ff % per) {
      std::fprintf(stderr, "bench_matvec: %s needs --hidden and --ff multiples of %lld (e.g. --hidden 1024 --kv 256 --ff 4096)\n",
                   name.c_str(), (long long)per);
      return 2;
    }
    std::mt19937 rng(1);
    std::vector<Mat> mats;
    for (int l = 0; l < layers; ++l)
      for (const auto& s : shapes) mats.push_back({random_blocks(dtype, s[0], s[1], rng), {}});
    mats.push_back({random_blocks(DType::q8_0, 49152, hidden, rng), {}});
    int64_t bytes = 0, idx = 0;
    for (Mat& m : mats) {
      const bool head = idx == static_cast<int64_t>(mats.size()) - 1;
      const int64_t rows = head ? 49152 : shapes[idx % 7][0], cols = head ? hidden : shapes[idx % 7][1];
      m.view = {head ? DType::q8_0 : dtype, m.bytes.data(), rows, cols};
      bytes += static_cast<int64_t>(m.bytes.size());
      ++idx;
    }
    std::vector<Mat> tiled_mats;  // the same matrices in tiles4, when some mode asks for them
    if (std::find(tiled.begin(), tiled.end(), true) != tiled.end() && dtype_cpu_int_blocks(dtype)) {
      for (const Mat& m : mats) {
        Mat t{m.bytes, m.view};
        kernels::weight_tiles4_pack(m.view.dtype, t.bytes.data(), m.view.rows, m.view.cols);
        t.view.data = t.bytes.data();
        t.view.layout = kernels::WeightLayout::tiles4;
        tiled_mats.push_back(std::move(t));
      }
    }
    std::vector<float> x(static_cast<size_t>(tokens * std::max(hidden, ff))),
        y(static_cast<size_t>(tokens * std::max<int64_t>(49152, std::max(hidden, ff))));
    std::mt19937 xr(2);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : x) v = u(xr);
    std::vector<std::vector<double>> times(acts.size());
    for (int r = -1; r < rounds; ++r) {  // round -1 warms up
      for (size_t a = 0; a < acts.size(); ++a) {
        kernels::matvec_act_set(acts[a]);
        kernels::q16act_vnni_enable(vnni[a]);
        const double t0 = now_seconds();
        // (a format without 4-row tiles runs its row-major blocks under a +tiles mode too)
        for (const Mat& m : tiled[a] && !tiled_mats.empty() ? tiled_mats : mats)
          kernels::matmul_matvec_cpu(x.data(), m.view, nullptr, y.data(), tokens);
        if (r >= 0) times[a].push_back(now_seconds() - t0);
      }
    }
    for (size_t a = 0; a < acts.size(); ++a) {
      const double t = median(times[a]);
      const double gbs = bytes / t / 1e9;
      const std::string act_name =
          std::string(kernels::matvec_act_name(acts[a])) + (vnni[a] ? "+vnni" : "") + (tiled[a] ? "+tiles" : "");
      std::printf("%-6s %-13s %9.1f %10.2f %8.1f %10.2f %10.2f\n", name.c_str(), act_name.c_str(),
                  bytes / 1048576.0, t * 1e3, gbs, bw.triad / gbs, bw.read / gbs);
    }
    std::fflush(stdout);
  }
  return 0;
}
