// Bad model inputs: every case in the table must come back from load_model as a non-ok
// Status with the expected code and a one-line message naming the offending file and
// the problem; none may crash (the suite runs under AddressSanitizer in CI).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "common/sys.h"
#include "tests/worker/tiny_checkpoint.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

using json = nlohmann::json;
using snap::testing::TempDir;
using snap::testing::write_file;
using snap::testing::write_safetensors_raw;

// A tiny valid HF model written by hand: 1 layer, hidden 8, 2 heads of 4, 1 KV head.
json tiny_config() {
  return json{{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 12}, {"hidden_size", 8},
              {"intermediate_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
              {"num_key_value_heads", 1}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true}};
}

std::map<std::string, std::vector<int64_t>> tiny_tensors() {
  const std::string p = "model.layers.0.";
  return {{"model.embed_tokens.weight", {12, 8}},
          {"model.norm.weight", {8}},
          {p + "input_layernorm.weight", {8}},
          {p + "post_attention_layernorm.weight", {8}},
          {p + "self_attn.q_proj.weight", {8, 8}},
          {p + "self_attn.k_proj.weight", {4, 8}},
          {p + "self_attn.v_proj.weight", {4, 8}},
          {p + "self_attn.o_proj.weight", {8, 8}},
          {p + "mlp.gate_proj.weight", {16, 8}},
          {p + "mlp.up_proj.weight", {16, 8}},
          {p + "mlp.down_proj.weight", {8, 16}}};
}

// F32 safetensors with the given tensors (values 0.5), consistent offsets.
void write_f32_safetensors(const std::string& path, const std::map<std::string, std::vector<int64_t>>& tensors) {
  json header = json::object();
  uint64_t off = 0;
  std::string data;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + 4 * n}}};
    const std::vector<float> v(static_cast<size_t>(n), 0.5f);
    data.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    off += static_cast<uint64_t>(4 * n);
  }
  write_safetensors_raw(path, header.dump(), data);
}

void write_hf(const std::string& dir, const json& config,
              const std::map<std::string, std::vector<int64_t>>& tensors) {
  std::filesystem::create_directories(dir);
  write_file(dir + "/config.json", config.dump());
  write_f32_safetensors(dir + "/model.safetensors", tensors);
}

// A HF dir whose model.safetensors has header `header` and `data_len` zero bytes of data.
std::string hf_with_raw_header(const TempDir& t, const std::string& header, size_t data_len,
                               int64_t claimed_len = -1) {
  const std::string dir = t / "m";
  std::filesystem::create_directories(dir);
  write_file(dir + "/config.json", tiny_config().dump());
  write_safetensors_raw(dir + "/model.safetensors", header, std::string(data_len, '\0'), claimed_len);
  return dir;
}

// GGUF writer for the GGUF cases: a valid 1-layer llama, then one thing broken.
constexpr const char* k_gguf_script = R"PY(
import sys, numpy as np, gguf
path, mode = sys.argv[1], sys.argv[2]
arch = "gpt2" if mode == "arch" else "llama"
w = gguf.GGUFWriter(path, arch)
h = 256
for k, v in [("block_count", 1), ("context_length", 64), ("embedding_length", h),
             ("feed_forward_length", h), ("attention.head_count", 2), ("attention.head_count_kv", 2)]:
    w.add_uint32(f"{arch}.{k}", v)
w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
w.add_uint32(f"{arch}.vocab_size", 8)
names = ["token_embd", "blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v", "blk.0.attn_output",
         "blk.0.ffn_gate", "blk.0.ffn_up", "blk.0.ffn_down"]
for n in names:
    rows = 8 if n == "token_embd" else h
    if mode == "missing" and n == "blk.0.ffn_down":
        continue
    if mode == "quant" and n == "blk.0.ffn_up":  # IQ2_XXS: 66 bytes per 256 values
        w.add_tensor(n + ".weight", np.zeros((rows, 66), dtype=np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
        continue
    w.add_tensor(n + ".weight", np.zeros((rows, h), dtype=np.float32))
for n in ["blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"]:
    w.add_tensor(n + ".weight", np.ones(h, dtype=np.float32))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
)PY";

std::string make_gguf(const TempDir& t, const std::string& mode) {
  write_file(t / "make.py", k_gguf_script);
  const std::string path = t / "model.gguf";
  const std::string cmd = "python3 '" + (t / "make.py") + "' '" + path + "' " + mode;
  if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "failed: " << cmd;
  return path;
}

struct Case {
  const char* name;
  // Builds the bad input under the temp dir; returns (path to load, file the message must name).
  std::function<std::pair<std::string, std::string>(const TempDir&)> setup;
  StatusCode code;
  const char* problem;  // must appear in the message
};

const Case k_cases[] = {
    {"header_lies_about_size",
     [](const TempDir& t) {
       const std::string d = hf_with_raw_header(
           t, R"({"model.norm.weight":{"dtype":"F32","shape":[8],"data_offsets":[0,16]}})", 16);
       return std::pair{d, d + "/model.safetensors"};
     },
     StatusCode::k_data_loss, "tensor 'model.norm.weight': data_offsets span 16 bytes but F32 [8] needs 32"},
    {"header_length_past_eof",
     [](const TempDir& t) {
       const std::string d = hf_with_raw_header(t, "{}", 0, int64_t{1} << 40);
       return std::pair{d, d + "/model.safetensors"};
     },
     StatusCode::k_data_loss, "runs past the end"},
    {"header_invalid_json",
     [](const TempDir& t) {
       const std::string d = hf_with_raw_header(t, R"({"a": {"dtype": "F32", )", 0);
       return std::pair{d, d + "/model.safetensors"};
     },
     StatusCode::k_data_loss, "header is not valid JSON"},
    {"offsets_past_end",
     [](const TempDir& t) {
       const std::string d = hf_with_raw_header(
           t, R"({"model.norm.weight":{"dtype":"F32","shape":[8],"data_offsets":[16,48]}})", 32);
       return std::pair{d, d + "/model.safetensors"};
     },
     StatusCode::k_data_loss, "outside the data section of 32 bytes"},
    {"file_shorter_than_length_field",
     [](const TempDir& t) {
       const std::string d = t / "m";
       std::filesystem::create_directories(d);
       write_file(d + "/config.json", tiny_config().dump());
       write_file(d + "/model.safetensors", "abc");
       return std::pair{d, d + "/model.safetensors"};
     },
     StatusCode::k_data_loss, "too short"},
    {"dtype_i64",
     [](const TempDir& t) {
       const std::string d =
           hf_with_raw_header(t, R"({"model.norm.weight":{"dtype":"I64","shape":[8],"data_offsets":[0,64]}})", 64);
       return std::pair{d, d + "/model.safetensors"};
     },
     StatusCode::k_unimplemented, "tensor 'model.norm.weight' has dtype I64"},
    {"dtype_f8",
     [](const TempDir& t) {
       const std::string d =
           hf_with_raw_header(t, R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", 8);
       return std::pair{d, d + "/model.safetensors"};
     },
     StatusCode::k_unimplemented, "tensor 'w' has dtype F8_E4M3"},
    {"missing_config_json",
     [](const TempDir& t) {
       const std::string d = t / "m";
       std::filesystem::create_directories(d);
       write_f32_safetensors(d + "/model.safetensors", tiny_tensors());
       return std::pair{d, d + "/config.json"};
     },
     StatusCode::k_not_found, "cannot open"},
    {"config_missing_field",
     [](const TempDir& t) {
       json c = tiny_config();
       c.erase("intermediate_size");
       write_hf(t / "m", c, tiny_tensors());
       return std::pair{t / "m", t / "m/config.json"};
     },
     StatusCode::k_not_found, "missing field 'intermediate_size'"},
    {"unsupported_architecture",
     [](const TempDir& t) {
       json c = tiny_config();
       c["architectures"] = {"FalconForCausalLM"};
       write_hf(t / "m", c, tiny_tensors());
       return std::pair{t / "m", t / "m/config.json"};
     },
     StatusCode::k_unimplemented, "unsupported architecture 'FalconForCausalLM'"},
    {"missing_tensor",
     [](const TempDir& t) {
       auto ts = tiny_tensors();
       ts.erase("model.layers.0.mlp.up_proj.weight");
       write_hf(t / "m", tiny_config(), ts);
       return std::pair{t / "m", t / "m"};
     },
     StatusCode::k_not_found, "missing tensor 'model.layers.0.mlp.up_proj.weight'"},
    {"wrong_tensor_shape",
     [](const TempDir& t) {
       auto ts = tiny_tensors();
       ts["model.layers.0.self_attn.q_proj.weight"] = {8, 4};
       write_hf(t / "m", tiny_config(), ts);
       return std::pair{t / "m", t / "m/model.safetensors"};
     },
     StatusCode::k_data_loss, "tensor 'model.layers.0.self_attn.q_proj.weight' has shape [8, 4], expected [8, 8]"},
    {"untied_without_lm_head",
     [](const TempDir& t) {
       json c = tiny_config();
       c["tie_word_embeddings"] = false;
       write_hf(t / "m", c, tiny_tensors());
       return std::pair{t / "m", t / "m"};
     },
     StatusCode::k_not_found, "missing tensor 'lm_head.weight'"},
    {"index_names_missing_shard",
     [](const TempDir& t) {
       const std::string d = t / "m";
       std::filesystem::create_directories(d);
       write_file(d + "/config.json", tiny_config().dump());
       json wm = json::object();
       for (const auto& [name, shape] : tiny_tensors()) wm[name] = "model-00001-of-00001.safetensors";
       write_file(d + "/model.safetensors.index.json", json{{"weight_map", wm}}.dump());
       return std::pair{d, d + "/model-00001-of-00001.safetensors"};
     },
     StatusCode::k_not_found, "no such file"},
    {"nonexistent_path",
     [](const TempDir& t) { return std::pair{t / "nope.gguf", t / "nope.gguf"}; }, StatusCode::k_not_found,
     "no such file or directory"},
    {"bare_safetensors_file",
     [](const TempDir& t) {
       write_f32_safetensors(t / "model.safetensors", tiny_tensors());
       return std::pair{t / "model.safetensors", t / "model.safetensors"};
     },
     StatusCode::k_invalid_argument, "pass its directory"},
    {"not_a_gguf",
     [](const TempDir& t) {
       write_file(t / "model.gguf", "this is not a model file at all");
       return std::pair{t / "model.gguf", t / "model.gguf"};
     },
     StatusCode::k_invalid_argument, "bad magic"},
    {"empty_file",
     [](const TempDir& t) {
       write_file(t / "model.gguf", "");
       return std::pair{t / "model.gguf", t / "model.gguf"};
     },
     StatusCode::k_invalid_argument, "bad magic"},
    {"gguf_truncated",
     [](const TempDir& t) {
       const std::string p = make_gguf(t, "ok");
       std::filesystem::resize_file(p, std::filesystem::file_size(p) / 2);
       return std::pair{p, p};
     },
     StatusCode::k_data_loss, ""},
    {"gguf_unsupported_architecture",
     [](const TempDir& t) {
       const std::string p = make_gguf(t, "arch");
       return std::pair{p, p};
     },
     StatusCode::k_unimplemented, "unsupported architecture 'gpt2'"},
    {"gguf_missing_tensor",
     [](const TempDir& t) {
       const std::string p = make_gguf(t, "missing");
       return std::pair{p, p};
     },
     StatusCode::k_not_found, "missing tensor 'blk.0.ffn_down.weight'"},
    {"gguf_unsupported_quant_type",
     [](const TempDir& t) {
       const std::string p = make_gguf(t, "quant");
       return std::pair{p, p};
     },
     StatusCode::k_unimplemented, "tensor 'blk.0.ffn_up.weight' has type iq2_xxs"},
};

class LoadErrors : public ::testing::TestWithParam<Case> {};

TEST_P(LoadErrors, OneLineStatusNamingFileAndProblem) {
  const Case& c = GetParam();
  TempDir t(c.name);
  const auto [path, file] = c.setup(t);
  Result<LoadedModel> r = load_model(path);
  ASSERT_FALSE(r.ok()) << c.name << " loaded";
  const std::string& m = r.status().message();
  RecordProperty("error", r.status().to_string());
  EXPECT_EQ(r.status().code(), c.code) << r.status().to_string();
  EXPECT_EQ(m.rfind(file + ": ", 0), 0u) << "message should start with '" << file << ": ': " << m;
  EXPECT_NE(m.find(c.problem), std::string::npos) << "expected '" << c.problem << "' in: " << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(Table, LoadErrors, ::testing::ValuesIn(k_cases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The hand-written tiny model itself is valid: the table's failures come from the one
// thing each case breaks.
TEST(LoadErrorsBaseline, HandWrittenTinyModelLoads) {
  TempDir t("ok");
  write_hf(t / "m", tiny_config(), tiny_tensors());
  Result<LoadedModel> r = load_model(t / "m");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->weights.layers[0].k_proj.rows(), 4);
  EXPECT_EQ(r->weights.layers[0].down_proj.f32()[127], 0.5f);
}

TEST(LoadErrorsBaseline, GgufWriterScriptMakesALoadableFile) {
  TempDir t("okg");
  Result<LoadedModel> r = load_model(make_gguf(t, "ok"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config.hidden_size, 256);
  EXPECT_TRUE(r->config.tie_word_embeddings);
}

// ---------------------------------------------------------------------------
// Memory: the loader's check before it allocates (weights.cpp check_fits_in_memory).

// The cgroup part of memory_headroom on made-up trees: v2 (memory.max, memory.current less
// active_file and inactive_file) and v1 (memory.limit_in_bytes, memory.usage_in_bytes less
// total_active_file and total_inactive_file),
// every directory from the process's cgroup up to the mount, the tightest winning; "max" and v1's
// huge "no limit" are no limit; a container that sees its own cgroup as the mount still finds it.
TEST(MemoryHeadroom, CgroupTreesFromTheLeafUp) {
  TempDir t("cgroup");
  const std::filesystem::path v2 = t / "v2", v1 = t / "v1";
  const auto write_file = [](const std::filesystem::path& p, const std::string& text) {
    std::filesystem::create_directories(p.parent_path());
    snap::testing::write_file(p.string(), text);
  };
  write_file(v2 / "kubepods/pod1/memory.max", "1000000000\n");
  write_file(v2 / "kubepods/pod1/memory.current", "600000000\n");
  write_file(v2 / "kubepods/pod1/memory.stat", "anon 400000000\nfile 150000000\nactive_file 50000000\n"
                                               "inactive_file 100000000\nshmem 7\n");
  write_file(v2 / "kubepods/memory.max", "max\n");
  write_file(v2 / "kubepods/memory.current", "900000000\n");
  MemoryHeadroom h = cgroup_memory_headroom("0::/kubepods/pod1\n", v2.string());
  EXPECT_EQ(h.bytes, 550000000);  // 1e9 - (6e8 - 5e7 - 1e8)
  EXPECT_EQ(h.limit, "cgroup " + (v2 / "kubepods/pod1/memory.max").string());
  // A tighter parent wins.
  write_file(v2 / "kubepods/memory.max", "950000000\n");
  h = cgroup_memory_headroom("0::/kubepods/pod1\n", v2.string());
  EXPECT_EQ(h.bytes, 50000000);
  EXPECT_EQ(h.limit, "cgroup " + (v2 / "kubepods/memory.max").string());
  // v1, as Slurm's task/cgroup sets it; other controllers' lines are passed over.
  write_file(v1 / "memory/slurm/job_7/memory.limit_in_bytes", "2000000000\n");
  write_file(v1 / "memory/slurm/job_7/memory.usage_in_bytes", "1500000000\n");
  write_file(v1 / "memory/slurm/job_7/memory.stat", "cache 9\ninactive_file 3\ntotal_active_file 100000000\n"
                                                     "total_inactive_file 400000000\n");
  write_file(v1 / "memory/memory.limit_in_bytes", "9223372036854771712\n");
  h = cgroup_memory_headroom("5:cpuset:/slurm/job_7\n4:memory:/slurm/job_7\n0::/\n", v1.string());
  EXPECT_EQ(h.bytes, 1000000000);
  EXPECT_EQ(h.limit, "cgroup " + (v1 / "memory/slurm/job_7/memory.limit_in_bytes").string());
  // No limit anywhere; a cgroup path the mount does not hold (a container's view) falls back to
  // the mount itself.
  EXPECT_EQ(cgroup_memory_headroom("4:memory:/\n", v1.string()).bytes, -1);
  write_file(v2 / "memory.max", "300000000\n");
  write_file(v2 / "memory.current", "100000000\n");
  h = cgroup_memory_headroom("0::/outside/the/container\n", v2.string());
  EXPECT_EQ(h.bytes, 200000000);
  EXPECT_EQ(h.limit, "cgroup " + (v2 / "memory.max").string());
  EXPECT_EQ(cgroup_memory_headroom("", v2.string()).bytes, -1);
}

// AddressSanitizer maps terabytes of shadow memory and cannot run under ulimit -v.
#if defined(__SANITIZE_ADDRESS__)
#define SNAP_SKIP_UNDER_ASAN() GTEST_SKIP() << "ulimit -v does not work under AddressSanitizer"
#else
#define SNAP_SKIP_UNDER_ASAN() (void)0
#endif

// Under an address-space limit (ulimit -v) the headroom is that limit less what is mapped.
TEST(MemoryHeadroom, AddressSpaceLimitLessWhatIsMapped) {
  SNAP_SKIP_UNDER_ASAN();
  EXPECT_EXIT(
      {
        const int64_t room = int64_t{64} << 20;
        rlimit as{};
        as.rlim_cur = as.rlim_max = static_cast<rlim_t>(mapped_bytes() + room);
        if (::setrlimit(RLIMIT_AS, &as) != 0) std::_Exit(2);
        const MemoryHeadroom h = memory_headroom();
        std::fprintf(stderr, "headroom %lld (%s)\n", static_cast<long long>(h.bytes), h.limit.c_str());
        std::_Exit(h.limit == "ulimit -v" && h.bytes > 0 && h.bytes <= room ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "headroom [0-9]+ \\(ulimit -v\\)");
}

// Gemma 3 270M Q4_K_M loaded for the CPU with --weight-dtype f32 needs over 1 GiB (every matrix
// in f32) from a 241 MiB file: with room for the file's mapping and 100 MiB more, the load stops
// before it allocates, in one line naming the need, the room, the limit and --weight-dtype q8_0.
// (A model named by SNAP_GEMMA_MODEL needs what it needs.)
TEST(MemoryHeadroom, WeightsBeyondTheLimitStopTheLoadInOneLine) {
  const char* env = std::getenv("SNAP_GEMMA_MODEL");
  const std::string model =
      env && *env ? env : std::string(std::getenv("HOME")) + "/.cache/snapserve/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "no " << model;
  SNAP_SKIP_UNDER_ASAN();
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(model));
  EXPECT_EXIT(
      {
        ::unsetenv("SNAP_NO_MEMORY_CHECK");
        rlimit as{};
        as.rlim_cur = as.rlim_max = static_cast<rlim_t>(mapped_bytes() + file_bytes + (int64_t{100} << 20));
        if (::setrlimit(RLIMIT_AS, &as) != 0) std::_Exit(2);
        LoadOptions f32;
        if (!apply_weight_dtype("f32", &f32).ok()) std::_Exit(3);
        const Result<LoadedModel> r = load_model(model, f32);
        std::fprintf(stderr, "%s\n", r.ok() ? "loaded" : r.status().to_string().c_str());
        const std::string& m = r.status().message();
        std::_Exit(!r.ok() && r.status().code() == StatusCode::k_resource_exhausted && m.find('\n') == std::string::npos &&
                           m.rfind(model + ": the weights need ", 0) == 0
                       ? 0
                       : 1);
      },
      ::testing::ExitedWithCode(0),
      "the weights need [0-9.]+ MiB as loaded here but this process may take [0-9.]+ MiB more \\(ulimit -v\\); "
      "--weight-dtype q8_0 stores the f32 matrices \\([0-9.]+ MiB\\) in about a quarter of that; "
      "SNAP_NO_MEMORY_CHECK=1 loads anyway");
}

}  // namespace
}  // namespace snap
