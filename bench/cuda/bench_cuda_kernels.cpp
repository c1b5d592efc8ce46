// GPU kernel benchmarks at the Llama-3-8B shape (32 layers, hidden 4096, 32 q / 8 KV heads,
// head_dim 128, MLP 14336, vocab 128256), bf16 weights and KV: the measured device
// bandwidth, prefill GEMMs (cuBLAS) as a share of the bf16 peak, decode GEMVs and paged
// attention against the HBM floor, prefill attention throughput, SnapKV selection per layer,
// block-format (Q8_0, Q4_0, Q4_1) weights' decode GEMVs against bf16's, and a per-token decode
// estimate composed from those kernel times (NOT an end-to-end run).
// Medians of 10 timed runs (CUDA events) after 2 warm-ups; values are constant fills (timing
// does not depend on them). Run by scripts/device_check.sh; prints one table to stdout.
//   usage: bench_cuda_kernels [--quick]   (--quick: 8K context only)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/block_split.h"
#include "kernels/cuda/kernels_cuda.h"

namespace {

using namespace snap::kernels;

constexpr double k_peak_bf16_tflops = 989.0;  // H100/H200 SXM dense bf16 (spec sheet)
constexpr int k_layers = 32, k_hidden = 4096, k_heads = 32, k_kv_heads = 8, k_head_dim = 128, k_mlp = 14336;
constexpr int k_vocab = 128256, k_block = 16;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_kernels: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench_cuda_kernels: %s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

// Device buffer filled with a constant byte (0x3C: bf16 0.0115, f32 0.0115).
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) {
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    check(cudaMemset(p, 0x3C, bytes), "cudaMemset");
  }
  ~Dev() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Median milliseconds of f() over 10 runs after 2 warm-ups.
double time_ms(const std::function<void()>& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 2; ++i) f();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> t;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  check(cudaGetLastError(), "timed kernel");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return (t[4] + t[5]) / 2;
}

void row(const std::string& what, double ms, const std::string& rate) {
  std::printf("  %-58s %10.3f ms  %s\n", what.c_str(), ms, rate.c_str());
}
std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

struct LayerWeights {  // one decoder layer, bf16 [rows, cols]
  Dev qkv{2ull * (k_heads + 2 * k_kv_heads) * k_head_dim * k_hidden}, o{2ull * k_hidden * k_hidden},
      gate_up{2ull * 2 * k_mlp * k_hidden}, down{2ull * k_hidden * k_mlp};
};
struct Gemm {
  const char* name;
  const Dev* w;
  int64_t rows, cols;
};

// A paged KV layer of `ctx` keys per KV head for each of `seqs` sequences (one slab, as the
// pool's), blocks in order, positions 0..ctx−1. view: sequence 0; view_of(b): sequence b.
struct PagedLayer {
  Dev k, v, pos, tables, heads;
  PagedKvCuda view;
  explicit PagedLayer(int64_t ctx, int64_t seqs = 1)
      : k(2ull * seqs * k_kv_heads * ctx * k_head_dim), v(2ull * seqs * k_kv_heads * ctx * k_head_dim),
        pos(4ull * seqs * k_kv_heads * ctx), tables(4ull * seqs * k_kv_heads * ctx / k_block),
        heads(sizeof(PagedKvHead) * seqs * k_kv_heads) {
    const int64_t nb = ctx / k_block, nh = seqs * k_kv_heads;
    std::vector<int32_t> p(static_cast<size_t>(nh * ctx)), t(static_cast<size_t>(nh * nb));
    for (int64_t b = 0; b < nh * nb; ++b) {
      t[b] = static_cast<int32_t>(b);
      for (int s = 0; s < k_block; ++s) p[b * k_block + s] = static_cast<int32_t>((b % nb) * k_block + s);
    }
    check(cudaMemcpy(pos.p, p.data(), p.size() * 4, cudaMemcpyHostToDevice), "positions");
    check(cudaMemcpy(tables.p, t.data(), t.size() * 4, cudaMemcpyHostToDevice), "tables");
    std::vector<PagedKvHead> h(static_cast<size_t>(nh));
    for (int64_t g = 0; g < nh; ++g) h[g] = {tables.as<int32_t>() + g * nb, ctx};
    check(cudaMemcpy(heads.p, h.data(), sizeof(PagedKvHead) * nh, cudaMemcpyHostToDevice), "heads");
    view.k_base = k.as<__nv_bfloat16>();
    view.v_base = v.as<__nv_bfloat16>();
    view.pos_base = pos.as<int32_t>();
    view.k_block_stride = view.v_block_stride = static_cast<int64_t>(k_block) * k_head_dim;
    view.pos_block_stride = k_block;
    view.block_size = k_block;
    view.heads = heads.as<PagedKvHead>();
    view.max_length = ctx;
  }
  PagedKvCuda view_of(int64_t b) const {
    PagedKvCuda v = view;
    v.heads += b * k_kv_heads;
    return v;
  }
};

// A continuous-batching decode step's attention over `seqs` sequences of kv's: one launch per
// sequence (attention_paged_cuda, as DeviceForward::decode_batch ran it) or all in one
// (attention_decode_rows_cuda, as it runs it now).
double decode_rows_ms(const PagedLayer& kv, int64_t seqs, bool one_launch) {
  AttentionParams p{k_heads, k_kv_heads, k_head_dim, 0.088388f, 0};
  const int64_t qd = int64_t{k_heads} * k_head_dim;
  Dev q(4ull * seqs * qd), out(4ull * seqs * qd), dqp(4ull * seqs);
  std::vector<int32_t> qp(static_cast<size_t>(seqs), static_cast<int32_t>(kv.view.max_length));
  check(cudaMemcpy(dqp.p, qp.data(), qp.size() * 4, cudaMemcpyHostToDevice), "q positions");
  std::vector<PagedKvCuda> views;
  for (int64_t b = 0; b < seqs; ++b) views.push_back(kv.view_of(b));
  const size_t ws_bytes = attention_decode_rows_workspace_bytes(seqs, views.data(), p);
  const size_t one_bytes = attention_paged_cuda_workspace_bytes(1, p, kv.view.max_length);
  Dev ws(std::max<size_t>(ws_bytes, 1));
  return time_ms([&] {
    if (one_launch) {
      check(attention_decode_rows_cuda(q.as<float>(), dqp.as<int32_t>(), seqs, views.data(), p, out.as<float>(), ws.p,
                                       ws_bytes, nullptr),
            "attention_decode_rows_cuda");
      return;
    }
    for (int64_t b = 0; b < seqs; ++b)
      check(attention_paged_cuda(q.as<float>() + b * qd, dqp.as<int32_t>() + b, 1, views[b], p, out.as<float>() + b * qd,
                                 ws.p, one_bytes, nullptr),
            "attention_paged_cuda");
  });
}

// tc: attention_prefill_tc_cuda (tensor cores, what prompt chunks run; kernel `prefill`) instead
// of attention_paged_cuda; decode: the kernel attention_paged_cuda runs decode rows on.
double attention_ms(const PagedLayer& kv, int64_t num_tokens, int32_t first_pos, bool tc = false,
                    DecodeAttention decode = DecodeAttention::key_threads,
                    PrefillAttention prefill = PrefillAttention::mma, int mma_warps = 4) {
  AttentionParams p{k_heads, k_kv_heads, k_head_dim, 0.088388f, 0};
  Dev q(4ull * num_tokens * k_heads * k_head_dim), out(4ull * num_tokens * k_heads * k_head_dim);
  std::vector<int32_t> qp(static_cast<size_t>(num_tokens));
  for (int64_t i = 0; i < num_tokens; ++i) qp[i] = first_pos + static_cast<int32_t>(i);
  Dev dqp(4ull * num_tokens);
  check(cudaMemcpy(dqp.p, qp.data(), qp.size() * 4, cudaMemcpyHostToDevice), "q positions");
  const size_t ws_bytes = attention_paged_cuda_workspace_bytes(num_tokens, p, kv.view.max_length);
  Dev ws(std::max<size_t>(ws_bytes, 1));
  return time_ms([&] {
    if (tc && prefill != PrefillAttention::wmma)
      check(attention_prefill_mma_cuda(q.as<float>(), dqp.as<int32_t>(), num_tokens, kv.view, p, out.as<float>(),
                                       nullptr, prefill == PrefillAttention::mma_bf16, mma_warps),
            "attention_prefill_mma_cuda");
    else if (tc)
      check(attention_prefill_tc_cuda(q.as<float>(), dqp.as<int32_t>(), num_tokens, kv.view, p, out.as<float>(), nullptr,
                                      prefill),
            "attention_prefill_tc_cuda");
    else
      check(attention_paged_cuda(q.as<float>(), dqp.as<int32_t>(), num_tokens, kv.view, p, out.as<float>(), ws.p,
                                 ws_bytes, nullptr, decode),
            "attention_paged_cuda");
  });
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_cuda_kernels: no usable GPU; nothing measured\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("bench_cuda_kernels on %s (%d SMs, %.0f GiB), Llama-3-8B shape, bf16\n", prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);

  // --- device bandwidth ---
  const size_t copy_bytes = 4ull << 30;
  Dev src(copy_bytes), dst(copy_bytes);
  const double copy_ms = time_ms([&] { check(cudaMemcpyAsync(dst.p, src.p, copy_bytes, cudaMemcpyDeviceToDevice), "copy"); });
  const double bw = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;  // read + write
  std::printf("device bandwidth:\n");
  row("cudaMemcpy D2D 4 GiB (read + write counted)", copy_ms, fmt("%.0f GB/s", bw));

  LayerWeights lw;
  Dev lm_head(2ull * k_vocab * k_hidden);
  const Gemm gemms[] = {{"qkv_proj 6144x4096", &lw.qkv, (k_heads + 2 * k_kv_heads) * k_head_dim, k_hidden},
                        {"o_proj 4096x4096", &lw.o, k_hidden, k_hidden},
                        {"gate_up_proj 28672x4096", &lw.gate_up, 2 * k_mlp, k_hidden},
                        {"down_proj 4096x14336", &lw.down, k_hidden, k_mlp},
                        {"lm_head 128256x4096", &lm_head, k_vocab, k_hidden}};
  cublasHandle_t h;
  check(snap::kernels::cublas_create(&h), "cublasCreate");

  std::printf("prefill GEMMs (cuBLAS bf16 -> f32, share of %.0f TFLOP/s):\n", k_peak_bf16_tflops);
  for (int64_t tokens : {512, 2048, 8192}) {
    Dev x(2ull * tokens * k_mlp), y(4ull * tokens * k_vocab / (tokens > 2048 ? 4 : 1));
    for (const Gemm& g : gemms) {
      if (g.rows == k_vocab && tokens > 2048) continue;  // the LM head runs on last positions only
      const double ms = time_ms([&] {
        check(matmul_bf16_cuda(h, x.as<__nv_bfloat16>(), g.w->as<__nv_bfloat16>(), nullptr, y.as<float>(), tokens, g.rows,
                               g.cols, nullptr),
              g.name);
      });
      const double tf = 2.0 * tokens * g.rows * g.cols / (ms * 1e-3) / 1e12;
      row(std::string(g.name) + " x " + std::to_string(tokens) + " tokens", ms,
          fmt("%.0f TFLOP/s = %.0f%% of peak", tf, 100.0 * tf / k_peak_bf16_tflops));
    }
  }

  std::printf("decode GEMVs (matmul_rowwise_cuda, batch-invariant; weight bytes / time vs %.0f GB/s):\n", bw);
  double layer_gemv_ms = 0, lm_head_ms = 0;
  for (int64_t tokens : {1, 8, 32}) {  // 32: four groups of 8 rows, which should share each weight row's HBM read
    Dev x(4ull * tokens * k_mlp), y(4ull * tokens * k_vocab);
    for (const Gemm& g : gemms)
      for (int loads : {4, 1}) {  // 16-byte loads in flight per lane: 4 (the default) vs 1, same bits
        if (loads == 1 && tokens != 1) continue;
        const double ms = time_ms([&] {
          matmul_rowwise_cuda(x.as<float>(), g.w->as<__nv_bfloat16>(), nullptr, y.as<float>(), tokens, g.rows, g.cols,
                              nullptr, loads);
        });
        const double gbs = 2.0 * g.rows * g.cols / (ms * 1e-3) / 1e9;
        row(std::string(g.name) + " x " + std::to_string(tokens) + " rows" + (loads == 1 ? ", 1 load in flight" : ""),
            ms, fmt("%.0f GB/s = %.2f x the HBM floor", gbs, bw / gbs));
        if (tokens == 1 && loads == 4) (g.rows == k_vocab ? lm_head_ms : layer_gemv_ms) += ms;
      }
  }

  // One token through a layer's GEMVs as DeviceForward runs them (fused launches) and as it ran
  // them before (one launch per matrix + SwiGLU + two residual adds): same bits, fewer launches.
  std::printf("a decode layer's GEMVs, 1 row (fused as DeviceForward runs them vs one launch per op):\n");
  {
    Dev x(4ull * k_mlp), xs(4ull * k_hidden), q(4ull * k_heads * k_head_dim), k(4ull * k_kv_heads * k_head_dim),
        v(4ull * k_kv_heads * k_head_dim), gate(4ull * k_mlp), up(4ull * k_mlp), h(4ull * k_hidden);
    const auto* qkv = lw.qkv.as<__nv_bfloat16>();
    const auto* gu = lw.gate_up.as<__nv_bfloat16>();
    const int64_t qd = int64_t{k_heads} * k_head_dim, kvd = int64_t{k_kv_heads} * k_head_dim;
    const RowwiseOut outs[3] = {{qkv, nullptr, q.as<float>(), qd},
                                {qkv + qd * k_hidden, nullptr, k.as<float>(), kvd},
                                {qkv + (qd + kvd) * k_hidden, nullptr, v.as<float>(), kvd}};
    const auto* o = lw.o.as<__nv_bfloat16>();
    const auto* down = lw.down.as<__nv_bfloat16>();
    const double fused[4] = {
        time_ms([&] { matmul_rowwise_multi_cuda(x.as<float>(), outs, 3, 1, k_hidden, nullptr); }),
        time_ms([&] { matmul_rowwise_residual_cuda(x.as<float>(), o, nullptr, xs.as<float>(), 1, k_hidden, k_hidden, nullptr); }),
        time_ms([&] { matmul_rowwise_swiglu_cuda(x.as<float>(), gu, gu + int64_t{k_mlp} * k_hidden, gate.as<float>(), 1, k_mlp, k_hidden, nullptr); }),
        time_ms([&] { matmul_rowwise_residual_cuda(gate.as<float>(), down, nullptr, xs.as<float>(), 1, k_hidden, k_mlp, nullptr); })};
    const double separate[4] = {
        time_ms([&] {
          for (const RowwiseOut& r : outs) matmul_rowwise_cuda(x.as<float>(), r.w, nullptr, r.y, 1, r.rows, k_hidden, nullptr);
        }),
        time_ms([&] {
          matmul_rowwise_cuda(x.as<float>(), o, nullptr, h.as<float>(), 1, k_hidden, k_hidden, nullptr);
          residual_add_cuda(xs.as<float>(), h.as<float>(), k_hidden, nullptr);
        }),
        time_ms([&] {
          matmul_rowwise_cuda(x.as<float>(), gu, nullptr, gate.as<float>(), 1, k_mlp, k_hidden, nullptr);
          matmul_rowwise_cuda(x.as<float>(), gu + int64_t{k_mlp} * k_hidden, nullptr, up.as<float>(), 1, k_mlp, k_hidden, nullptr);
          swiglu_cuda(gate.as<float>(), up.as<float>(), gate.as<float>(), k_mlp, nullptr);
        }),
        time_ms([&] {
          matmul_rowwise_cuda(gate.as<float>(), down, nullptr, h.as<float>(), 1, k_hidden, k_mlp, nullptr);
          residual_add_cuda(xs.as<float>(), h.as<float>(), k_hidden, nullptr);
        })};
    const char* names[4] = {"q, k, v (matmul_rowwise_multi_cuda)", "o_proj + residual (matmul_rowwise_residual_cuda)",
                            "gate, up, SwiGLU (matmul_rowwise_swiglu_cuda)", "down_proj + residual (matmul_rowwise_residual_cuda)"};
    const double bytes[4] = {2.0 * (qd + 2 * kvd) * k_hidden, 2.0 * k_hidden * k_hidden, 2.0 * 2 * k_mlp * k_hidden,
                             2.0 * k_hidden * k_mlp};
    double fused_sum = 0, separate_sum = 0, bytes_sum = 0;
    for (int i = 0; i < 4; ++i) {
      const double gbs = bytes[i] / (fused[i] * 1e-3) / 1e9;
      row(names[i], fused[i], fmt("%.2f x the HBM floor; one launch per op: %.3f ms", bw / gbs, separate[i]));
      fused_sum += fused[i];
      separate_sum += separate[i];
      bytes_sum += bytes[i];
    }
    row("a layer, fused (4 launches; one launch per op: 11)", fused_sum,
        fmt("%.2f x the HBM floor; one launch per op: %.3f ms", bw / (bytes_sum / (fused_sum * 1e-3) / 1e9), separate_sum) +
            fmt(", %.2f x the floor", bw / (bytes_sum / (separate_sum * 1e-3) / 1e9)));
    layer_gemv_ms = fused_sum;  // the composed estimate below takes what the model runs
  }

  // Block-format weights on the device (--weight-dtype q8_0; a GGUF's Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/
  // Q4_K/Q6_K/Q5_K/Q3_K/Q2_K with auto): 1.0625, 0.5625, 0.625, 0.6875, 0.75, 0.5625, 0.8203,
  // 0.6875, 0.4297 and 0.3281 bytes a weight against bf16's 2. Each GEMV paired with the bf16 one in the same loop; then a layer's fused GEMVs,
  // and a prompt GEMM's cost of dequantizing its weights for cuBLAS (DeviceForward does it in
  // slabs of <= 32 Mi weights into one bf16 buffer).
  std::printf("block-format weights (q8_0 / q4_0 / q4_1 / q5_0 / q5_1 / q4_k / q6_k / q5_k / q3_k / q2_k: 1.0625 / "
              "0.5625 / 0.625 / 0.6875 / 0.75 / 0.5625 / 0.8203 / 0.6875 / 0.4297 / 0.3281 bytes a weight), 1 row, vs "
              "bf16:\n");
  {
    struct Blocks {
      Dev q, d, m, e;
      BlockWeights w;
      Blocks(BlockFormat f, int64_t rows, int64_t cols)
          : q(static_cast<size_t>(rows * block_quant_row_bytes(f, cols))),
            d(static_cast<size_t>(2 * rows * cols / block_format_elems(f))),
            m(static_cast<size_t>(2 * rows * cols / block_format_elems(f))),
            e(static_cast<size_t>(std::max<int64_t>(1, rows * block_extra_row_bytes(f, cols)))) {
        w.format = f;
        w.quants = q.p;
        w.scales = d.as<uint16_t>();
        w.mins = block_format_has_mins(f) ? m.as<uint16_t>() : nullptr;
        w.extra = block_extra_row_bytes(f, cols) > 0 ? e.as<uint8_t>() : nullptr;
      }
      // Rows from `begin` of a matrix `cols` wide.
      BlockWeights rows_from(int64_t begin, int64_t cols) const { return block_rows_from(w, cols, begin); }
    };
    constexpr int k_nformats = static_cast<int>(std::size(k_all_block_formats));
    const BlockFormat* formats = k_all_block_formats;
    const char* fnames[k_nformats];
    double bpw[k_nformats];  // bytes a weight
    for (int f = 0; f < k_nformats; ++f) {
      fnames[f] = block_format_name(formats[f]);
      bpw[f] = static_cast<double>(block_format_ggml_bytes(formats[f])) / static_cast<double>(block_format_elems(formats[f]));
    }
    Dev x(4ull * k_mlp), y(4ull * k_vocab);
    for (const Gemm& g : gemms) {
      const double bf16_ms = time_ms([&] {
        matmul_rowwise_cuda(x.as<float>(), g.w->as<__nv_bfloat16>(), nullptr, y.as<float>(), 1, g.rows, g.cols, nullptr);
      });
      for (int f = 0; f < k_nformats; ++f) {
        Blocks w(formats[f], g.rows, g.cols);
        const double ms = time_ms([&] {
          matmul_rowwise_blocks_cuda(x.as<float>(), w.w, nullptr, y.as<float>(), 1, g.rows, g.cols, nullptr);
        });
        const double gbs = bpw[f] * g.rows * g.cols / (ms * 1e-3) / 1e9;
        row(std::string(g.name) + " x 1 row, " + fnames[f], ms,
            fmt("%.0f GB/s = %.2f x the HBM floor; bf16 %.3f ms: %.2fx", gbs, bw / gbs, bf16_ms, bf16_ms / ms));
      }
    }
    const int64_t qd = int64_t{k_heads} * k_head_dim, kvd = int64_t{k_kv_heads} * k_head_dim;
    Dev xs(4ull * k_hidden), q(4ull * qd), k(4ull * kvd), v(4ull * kvd), gate(4ull * k_mlp);
    for (int f = 0; f < k_nformats; ++f) {
      Blocks qkv(formats[f], qd + 2 * kvd, k_hidden), o(formats[f], k_hidden, k_hidden),
          gate_up(formats[f], 2 * k_mlp, k_hidden), down(formats[f], k_hidden, k_mlp);
      RowwiseOut outs[3] = {{nullptr, nullptr, q.as<float>(), qd}, {nullptr, nullptr, k.as<float>(), kvd},
                            {nullptr, nullptr, v.as<float>(), kvd}};
      const int64_t offsets[3] = {0, qd, qd + kvd};
      for (int i = 0; i < 3; ++i) outs[i].blocks = qkv.rows_from(offsets[i], k_hidden);
      const double layer_ms = time_ms([&] {
        matmul_rowwise_multi_cuda(x.as<float>(), outs, 3, 1, k_hidden, nullptr);
        matmul_rowwise_residual_blocks_cuda(x.as<float>(), o.w, nullptr, xs.as<float>(), 1, k_hidden, k_hidden, nullptr);
        matmul_rowwise_swiglu_blocks_cuda(x.as<float>(), gate_up.w, gate_up.rows_from(k_mlp, k_hidden), gate.as<float>(), 1,
                                          k_mlp, k_hidden, nullptr);
        matmul_rowwise_residual_blocks_cuda(gate.as<float>(), down.w, nullptr, xs.as<float>(), 1, k_hidden, k_mlp, nullptr);
      });
      const double layer_bytes = bpw[f] * ((qd + 2 * kvd) * k_hidden + k_hidden * k_hidden + 3.0 * k_mlp * k_hidden);
      row(std::string("a layer, fused, ") + fnames[f] + " (4 launches)", layer_ms,
          fmt("%.2f x the HBM floor; bf16 fused %.3f ms: %.2fx", bw / (layer_bytes / (layer_ms * 1e-3) / 1e9),
              layer_gemv_ms, layer_gemv_ms / layer_ms));
      // A prompt chunk's gate_up GEMM: dequantize (2 slabs of 14336 rows) + cuBLAS, vs bf16's GEMM.
      const int64_t tokens = 2048, slab = k_mlp;
      Dev xb(2ull * tokens * k_hidden), yb(4ull * tokens * 2 * k_mlp), wb(2ull * slab * k_hidden);
      const double deq_ms = time_ms([&] {
        for (int64_t r = 0; r < 2 * k_mlp; r += slab)
          dequant_blocks_to_bf16_cuda(gate_up.rows_from(r, k_hidden), slab * k_hidden, wb.as<__nv_bfloat16>(), nullptr);
      });
      const double blocks_gemm_ms = time_ms([&] {
        for (int64_t r = 0; r < 2 * k_mlp; r += slab) {
          dequant_blocks_to_bf16_cuda(gate_up.rows_from(r, k_hidden), slab * k_hidden, wb.as<__nv_bfloat16>(), nullptr);
          check(matmul_bf16_cuda(h, xb.as<__nv_bfloat16>(), wb.as<__nv_bfloat16>(), nullptr, yb.as<float>() + r, tokens,
                                 slab, k_hidden, nullptr, 2 * k_mlp),
                "slab GEMM");
        }
      });
      const double bf16_gemm_ms = time_ms([&] {
        check(matmul_bf16_cuda(h, xb.as<__nv_bfloat16>(), lw.gate_up.as<__nv_bfloat16>(), nullptr, yb.as<float>(), tokens,
                               2 * k_mlp, k_hidden, nullptr),
              "bf16 GEMM");
      });
      row(std::string("gate_up_proj x 2048 tokens, ") + fnames[f] + " (dequantize 2 slabs + cuBLAS)", blocks_gemm_ms,
          fmt("dequantize %.3f ms; bf16 GEMM %.3f ms: %.2fx its time", deq_ms, bf16_gemm_ms,
              blocks_gemm_ms / bf16_gemm_ms));
    }
  }

  std::printf("paged attention, one layer (32 q / 8 KV heads, head_dim 128):\n");
  std::vector<int64_t> contexts = quick ? std::vector<int64_t>{8192} : std::vector<int64_t>{8192, 32768, 131072};
  std::vector<double> decode_attn_ms;
  for (int64_t ctx : contexts) {
    PagedLayer kv(ctx);
    const double bytes = 2.0 * 2 * k_kv_heads * ctx * k_head_dim;  // K + V bf16
    for (const DecodeAttention da : {DecodeAttention::key_threads, DecodeAttention::pipelined, DecodeAttention::row_warps}) {
      const double ms = attention_ms(kv, 1, static_cast<int32_t>(ctx), false, da);
      if (da == DecodeAttention::key_threads) decode_attn_ms.push_back(ms);  // the default
      const char* name = da == DecodeAttention::key_threads ? "key_threads"
                         : da == DecodeAttention::pipelined ? "pipelined"
                                                            : "row_warps";
      row(std::string("decode (") + name + "), 1 query, " +
              std::to_string(ctx) + " keys per head",
          ms, fmt("%.0f GB/s = %.2f x the HBM floor", bytes / (ms * 1e-3) / 1e9, bw / (bytes / (ms * 1e-3) / 1e9)));
    }
    const int64_t chunk = std::min<int64_t>(ctx, 2048);
    // causal: query i sees ctx − chunk + i + 1 keys; 4 flops per (query, key, dim): QK and PV
    // (the useful ones: the tensor-core kernel's bf16-pair MMAs do twice as many)
    const double flops = 4.0 * k_heads * k_head_dim * (chunk * (ctx - chunk) + chunk * (chunk + 1) / 2.0);
    // The prompt kernels: mma (the default, f32-accurate; 4 warps, and 8 for comparison),
    // mma_bf16 (bf16 operands), wmma (the first tensor-core kernel), then the f32 CUDA-core one.
    const std::tuple<const char*, bool, PrefillAttention, int> kernels[] = {
        {"tensor cores, mma", true, PrefillAttention::mma, 4},
        {"tensor cores, mma 8 warps", true, PrefillAttention::mma, 8},
        {"tensor cores, mma_bf16", true, PrefillAttention::mma_bf16, 4},
        {"tensor cores, mma_bf16 8 warps", true, PrefillAttention::mma_bf16, 8},
        {"tensor cores, wmma", true, PrefillAttention::wmma, 4},
        {"f32 CUDA cores", false, PrefillAttention::mma, 4}};
    for (const auto& [name, tc, kernel, warps] : kernels) {
      const double pms =
          attention_ms(kv, chunk, static_cast<int32_t>(ctx - chunk), tc, DecodeAttention::key_threads, kernel, warps);
      const double tf = flops / (pms * 1e-3) / 1e12;
      row(std::string("prefill (") + name + "), last " + std::to_string(chunk) + " queries over " + std::to_string(ctx) +
              " keys",
          pms, fmt("%.1f TFLOP/s = %.1f%% of peak", tf, 100.0 * tf / k_peak_bf16_tflops));
    }
  }
  PagedLayer snap_kv(2048);
  const double snap_attn_ms = attention_ms(snap_kv, 1, 1 << 20);
  {
    const double bytes = 2.0 * 2 * k_kv_heads * 2048 * k_head_dim;
    const std::pair<const char*, double> runs[] = {
        {"key_threads", snap_attn_ms},
        {"pipelined", attention_ms(snap_kv, 1, 1 << 20, false, DecodeAttention::pipelined)},
        {"row_warps", attention_ms(snap_kv, 1, 1 << 20, false, DecodeAttention::row_warps)}};
    for (const auto& [name, ms] : runs)
      row(std::string("decode (") + name + "), 1 query, 2048 keys per head (SnapKV's budget)", ms, fmt("%.0f GB/s = %.2f x the HBM floor", bytes / (ms * 1e-3) / 1e9, bw / (bytes / (ms * 1e-3) / 1e9)));
  }

  // Continuous batching: every sequence's decode row of one layer, SnapKV-sized heads, in one
  // launch (+ one merge) against one launch (+ merge) per sequence. Same bits; fewer launches.
  std::printf("a decode step of B sequences, one layer, 2048 keys per head each (one launch vs one per sequence):\n");
  {
    const std::vector<int64_t> batches = quick ? std::vector<int64_t>{8, 64} : std::vector<int64_t>{1, 8, 32, 64, 128};
    PagedLayer many(2048, batches.back());
    for (int64_t seqs : batches) {
      const double one = decode_rows_ms(many, seqs, true), each = decode_rows_ms(many, seqs, false);
      const double bytes = 2.0 * 2 * k_kv_heads * 2048 * k_head_dim * seqs;
      row("attention_decode_rows_cuda, " + std::to_string(seqs) + " sequences", one,
          fmt("%.2f x the HBM floor; one launch per sequence: %.3f ms", bw / (bytes / (one * 1e-3) / 1e9), each) +
              fmt(" (%.2f x the floor)", bw / (bytes / (each * 1e-3) / 1e9)));
    }
  }

  std::printf("SnapKV selection, one layer (W 32, avg pooling kernel 31, budget 2048):\n");
  for (int64_t ctx : contexts) {
    if (ctx > 32768) continue;  // the window x all-keys pass is the same work per key beyond
    PagedLayer kv(ctx);
    AttentionParams p{k_heads, k_kv_heads, k_head_dim, 0.0f, 0};
    SnapKvCudaParams sp;
    sp.budget = 2048;
    const size_t ws_bytes = snapkv_select_cuda_workspace_bytes(ctx, p, sp);
    Dev ws(ws_bytes), qw(4ull * 32 * k_heads * k_head_dim), scores(4ull * k_kv_heads * ctx), kept(4ull * k_kv_heads * 2048);
    const double ms = time_ms([&] {
      check(snapkv_select_cuda(qw.as<float>(), kv.view, ctx, p, sp, scores.as<float>(), kept.as<int32_t>(), ws.p, ws_bytes,
                               nullptr),
            "snapkv_select_cuda");
    });
    row("select over " + std::to_string(ctx) + " tokens", ms, "");
  }
  snap::kernels::cublas_destroy(h);

  // Decode estimate: the model's kernel times added up (the fused GEMVs; norms, RoPE, the KV
  // append and launch gaps excluded), against the floor: bytes that must be read per token / measured bandwidth.
  std::printf("decode per token, composed from the kernel times above (estimate, not an end-to-end run):\n");
  const double weight_bytes = 2.0 * (k_layers * (double(k_heads + 2 * k_kv_heads) * k_head_dim * k_hidden +
                                                 double(k_hidden) * k_hidden + 3.0 * k_mlp * k_hidden) +
                                     double(k_vocab) * k_hidden);
  for (size_t i = 0; i < contexts.size(); ++i) {
    const int64_t ctx = contexts[i];
    for (int snap = 0; snap < 2; ++snap) {
      const int64_t keys = snap ? 2048 : ctx;
      const double ms = k_layers * (layer_gemv_ms + (snap ? snap_attn_ms : decode_attn_ms[i])) + lm_head_ms;
      const double floor_ms = (weight_bytes + k_layers * 2.0 * 2 * k_kv_heads * keys * k_head_dim) / (bw * 1e9) * 1e3;
      row(std::string(snap ? "snapkv B=2048" : "full") + ", context " + std::to_string(ctx), ms,
          fmt("%.1f tok/s, %.2f x the HBM floor", 1e3 / ms, ms / floor_ms));
    }
  }
  return 0;
}
