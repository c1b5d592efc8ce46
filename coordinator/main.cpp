// The `snapserve` binary: subcommands `generate` (one prompt → stdout, timing → stderr)
// and `inspect` (a model's config and tensors). Every bad flag or file ends with a
// one-line error on stderr and exit code 1 (2 for a usage error), never a crash.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "common/sys.h"
#include "coordinator/engine/generate.h"
#include "coordinator/engine/logits_dump.h"
#include "coordinator/engine/prompt.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/kernels.h"
#include "worker/model/dequant.h"
#include "worker/model/gguf.h"
#include "worker/model/safetensors.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

std::string default_model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  std::string cache;
  if (const char* c = std::getenv("SNAP_CACHE")) {
    cache = c;
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home ? home : ".") + "/.cache/snapserve";
  }
  return cache + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

int fail(const std::string& message) {
  std::fprintf(stderr, "snapserve: error: %s\n", message.c_str());
  return 1;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

// --- generate ------------------------------------------------------------------

struct GenerateArgs {
  std::string model = default_model_path();
  std::string prompt;
  std::string prompt_file;
  std::string system;
  int64_t max_tokens = 128;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool chat = false;
  bool ignore_eos = false;
  std::string dump_logits;
  int threads = 0;
  int64_t prefill_chunk = 512;
  std::string weight_dtype = "f32";
};

int run_generate(const GenerateArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  std::string text = a.prompt;
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file, std::ios::binary);
    if (!in) return fail(a.prompt_file + ": cannot read prompt file");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }

  LoadOptions opts;
  if (a.weight_dtype == "f16") opts.weight_dtype = DType::f16;
  if (a.weight_dtype == "bf16") opts.weight_dtype = DType::bf16;
  const double t_load = now_seconds();
  auto model = load_model(a.model, opts);
  if (!model.ok()) return fail(model.status().message());
  auto tok = Tokenizer::load_for_model(a.model);
  if (!tok.ok()) return fail(tok.status().message());
  const double load_seconds = now_seconds() - t_load;

  GenerateRequest req;
  if (a.chat) {
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", text});
    auto ids = prompt_ids_for_chat(*tok, msgs);
    if (!ids.ok()) return fail(ids.status().message());
    req.prompt_ids = std::move(ids).value();
  } else {
    req.prompt_ids = prompt_ids_for_text(*tok, text);
  }
  req.max_tokens = a.max_tokens;
  req.sampling.temperature = a.temperature;
  req.sampling.top_p = a.top_p;
  req.sampling.top_k = a.top_k;
  req.sampling.min_p = a.min_p;
  req.sampling.seed = a.seed;
  req.prefill_chunk = a.prefill_chunk;
  if (!a.ignore_eos) {
    req.stop_ids = tok->eos_ids();
    for (int32_t id : model->config.eos_token_ids) req.stop_ids.push_back(id);
  }

  LlamaForward forward(*model);
  std::unique_ptr<LogitsDumpWriter> dump;
  GenerateHooks hooks;
  if (!a.dump_logits.empty()) {
    auto w = LogitsDumpWriter::open(a.dump_logits, req.prompt_ids, model->config.vocab_size);
    if (!w.ok()) return fail(w.status().message());
    dump.reset(w.value());
    hooks.on_prompt_logits = [&](int64_t, const float* row) { dump->write_row(row); };
  }
  StreamDecoder decoder(*tok, true);
  const std::vector<int32_t>& stops = req.stop_ids;
  hooks.on_token = [&](int32_t id) {
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) return true;  // not printed
    const std::string piece = decoder.push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  };

  auto result = generate(forward, req, hooks);
  if (!result.ok()) return fail(result.status().message());
  const std::string tail = decoder.flush();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (dump) {
    Status s = dump->close();
    if (!s.ok()) return fail(s.message());
  }

  const GenerateStats& st = result->stats;
  const double decode_tps = st.generated_tokens > 1 ? (st.generated_tokens - 1) / st.decode_seconds : 0.0;
  std::fprintf(stderr,
               "snapserve: model %s (%s, %s weights %s), load %.2f s, %d threads, simd %s\n"
               "snapserve: prompt tokens %lld, prefill %.2f s (%.1f tok/s)\n"
               "snapserve: generated tokens %lld (finish: %s), decode %.2f s (%.1f tok/s)\n"
               "snapserve: kv cache %s used, %s allocated; peak RSS %s\n",
               model->config.name.c_str(), model->format.c_str(), human_bytes(model->weights.nbytes()).c_str(),
               dtype_name(opts.weight_dtype), load_seconds, omp_get_max_threads(), kernels::simd_level_name(),
               static_cast<long long>(st.prompt_tokens), st.prefill_seconds,
               st.prompt_tokens / std::max(st.prefill_seconds, 1e-9), static_cast<long long>(st.generated_tokens),
               result->finish_reason.c_str(), st.decode_seconds, decode_tps, human_bytes(st.kv_bytes).c_str(),
               human_bytes(st.kv_allocated_bytes).c_str(), human_bytes(peak_rss_bytes()).c_str());
  return 0;
}

// --- inspect -------------------------------------------------------------------

std::string dims_string(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

void print_config(const ModelConfig& c) {
  std::printf("architecture       %s\n", arch_name(c.arch));
  std::printf("name               %s\n", c.name.c_str());
  std::printf("layers             %d\n", c.num_layers);
  std::printf("hidden_size        %lld\n", static_cast<long long>(c.hidden_size));
  std::printf("intermediate_size  %lld\n", static_cast<long long>(c.intermediate_size));
  std::printf("heads / kv heads   %d / %d (head_dim %d)\n", c.num_heads, c.num_kv_heads, c.head_dim);
  std::printf("vocab_size         %lld\n", static_cast<long long>(c.vocab_size));
  std::printf("context            %lld\n", static_cast<long long>(c.max_position));
  std::printf("rope theta         %g (scaling %s, factor %g)\n", c.rope.theta,
              c.rope.scaling == kernels::RopeScaling::none     ? "none"
              : c.rope.scaling == kernels::RopeScaling::linear ? "linear"
                                                               : "llama3",
              c.rope.factor);
  std::printf("rms_norm_eps       %g\n", c.rms_norm_eps);
  std::printf("sliding_window     %d\n", c.sliding_window);
  std::printf("tied embeddings    %s\n", c.tie_word_embeddings ? "yes" : "no");
  std::printf("qkv bias           %s\n", c.attention_bias ? "yes" : "no");
  const int64_t kv_per_token = 2LL * c.num_layers * c.num_kv_heads * c.head_dim * 4;
  std::printf("kv bytes / token   %lld (f32)\n", static_cast<long long>(kv_per_token));
}

int run_inspect(const std::string& path, bool tensors) {
  const bool is_gguf = path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  if (is_gguf) {
    auto f = GgufFile::open(path);
    if (!f.ok()) return fail(f.status().message());
    auto c = config_from_gguf(*f);
    if (!c.ok()) return fail(c.status().message());
    std::printf("file               %s (GGUF v%u, %s, %zu tensors, %zu metadata keys)\n", path.c_str(), f->version(),
                human_bytes(static_cast<double>(f->file_size())).c_str(), f->tensors().size(), f->metadata().size());
    print_config(*c);
    std::map<std::string, int64_t> by_type;
    int64_t params = 0;
    for (const GgufTensor& t : f->tensors()) {
      by_type[ggml_type_info(t.type).name] += t.num_elements;
      params += t.num_elements;
    }
    std::printf("parameters         %.1fM:", params / 1e6);
    for (auto& [name, n] : by_type) std::printf(" %s %.1fM", name.c_str(), n / 1e6);
    std::printf("\n");
    if (tensors) {
      for (const GgufTensor& t : f->tensors()) {
        std::printf("  %-40s %-6s %s\n", t.name.c_str(), ggml_type_info(t.type).name, dims_string(t.dims).c_str());
      }
    }
    return 0;
  }
  auto c = config_from_hf_json(path + "/config.json");
  if (!c.ok()) return fail(c.status().message());
  auto st = SafetensorsModel::open(path);
  if (!st.ok()) return fail(st.status().message());
  std::printf("directory          %s (safetensors, %zu tensors)\n", path.c_str(), st->tensors().size());
  print_config(*c);
  int64_t params = 0;
  for (auto& [name, t] : st->tensors()) params += t.num_elements;
  std::printf("parameters         %.1fM\n", params / 1e6);
  if (tensors) {
    for (auto& [name, t] : st->tensors()) {
      std::printf("  %-50s %-5s %s\n", name.c_str(), dtype_name(t.dtype), dims_string(t.shape).c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  using namespace snap;
  CLI::App app{"snapserve: long-context LLM serving with SnapKV KV-cache compression"};
  app.require_subcommand(1);

  GenerateArgs g;
  auto* gen = app.add_subcommand("generate", "Generate a completion for one prompt (text to stdout, timing to stderr)");
  gen->add_option("--model", g.model, "GGUF file or Hugging Face directory (default: $SNAP_MODEL or the cached SmolLM2-135M-Instruct)");
  auto* p1 = gen->add_option("--prompt", g.prompt, "Prompt text");
  auto* p2 = gen->add_option("--prompt-file", g.prompt_file, "Read the prompt from a file")->check(CLI::ExistingFile);
  p1->excludes(p2);
  gen->add_option("--max-tokens", g.max_tokens, "Maximum new tokens (default 128)")->check(CLI::Range(0, 1 << 20));
  gen->add_option("--temperature", g.temperature, "Sampling temperature; 0 = greedy (default 0)")->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-p", g.top_p, "Nucleus sampling mass in (0, 1] (default 1 = off)")->check(CLI::Range(1e-6, 1.0));
  gen->add_option("--top-k", g.top_k, "Keep the k most likely tokens (default 0 = off)")->check(CLI::Range(0, 1 << 30));
  gen->add_option("--min-p", g.min_p, "Drop tokens below min_p * p(max) (default 0 = off)")->check(CLI::Range(0.0, 1.0));
  gen->add_option("--seed", g.seed, "Random seed for sampling (default 0)");
  gen->add_flag("--chat", g.chat, "Wrap the prompt in the model's chat template as a user message");
  gen->add_option("--system", g.system, "System message for --chat");
  gen->add_flag("--ignore-eos", g.ignore_eos, "Keep generating past end-of-sequence tokens");
  gen->add_option("--dump-logits", g.dump_logits, "Write every prompt position's logits to FILE (format: tools/read_logits.py)");
  gen->add_option("--threads", g.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));
  gen->add_option("--prefill-chunk", g.prefill_chunk, "Prompt tokens per prefill step (default 512)")->check(CLI::Range(1, 1 << 20));
  gen->add_option("--weight-dtype", g.weight_dtype, "Storage of projection weights: f32 (default), f16, bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));

  std::string inspect_model = default_model_path();
  bool inspect_tensors = false;
  auto* ins = app.add_subcommand("inspect", "Print a model's configuration and tensor table");
  ins->add_option("--model", inspect_model, "GGUF file or Hugging Face directory");
  ins->add_flag("--tensors", inspect_tensors, "List every tensor");

  if (argc > 1 && argv[1][0] != '-' && std::string(argv[1]) != "generate" && std::string(argv[1]) != "inspect") {
    std::fprintf(stderr, "snapserve: error: unknown subcommand '%s' (expected: generate, inspect; see --help)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) {
      std::fprintf(stderr, "snapserve: error: %s (see --help)\n", e.what());
      return 2;
    }
    return app.exit(e);
  }
  if (*gen) {
    if (g.prompt.empty() && g.prompt_file.empty()) return snap::fail("generate needs --prompt TEXT or --prompt-file F");
    return run_generate(g);
  }
  if (*ins) return run_inspect(inspect_model, inspect_tensors);
  return 0;
}
