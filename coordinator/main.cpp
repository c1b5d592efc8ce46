// The `snapserve` binary: subcommands `generate` (one prompt → stdout, timing → stderr),
// `serve` (the HTTP API), `batch` (a JSONL corpus offline), `bench` and `inspect` (a
// model's config and tensors). Every bad flag or file ends with a
// one-line error on stderr and exit code 1 (2 for a usage error), never a crash.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <sstream>
#include <string>

#include "comm/bootstrap.h"
#include "coordinator/batch/batch_cli.h"
#include "common/sys.h"
#include "coordinator/engine/device_spec.h"
#include "coordinator/engine/generate.h"
#include "coordinator/engine/logits_dump.h"
#include "coordinator/engine/model_path.h"
#include "coordinator/engine/prompt.h"
#include "coordinator/engine/tp_launch.h"
#include "coordinator/http/serve_cli.h"
#include "coordinator/loadgen/bench_serve.h"
#include "coordinator/scheduler/out_of_memory.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "eval/scoring/cli/scoring_cli.h"
#include "eval/longctx/eval_cli.h"
#include "kernels/kernels.h"
#include "kernels/matvec_act.h"
#include "kernels/thread_wait.h"
#include "worker/kv/policy.h"
#include "worker/model/dequant.h"
#include "worker/model/gguf.h"
#include "worker/model/safetensors.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

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
  TpFlags parallel;  // --tp, --threads, --rank, --world-size, --leader
  int64_t prefill_chunk = 512;
  std::string question;
  KvFlags kv = [] {  // --kv-policy and its parameters
    KvFlags k;
    k.policy = "full";
    return k;
  }();
  int64_t kv_cache_mib = 0;
  std::string dump_kv_selection;
  std::string weight_dtype = "auto";
  std::string device = "cpu";  // --device cpu | cuda[:N]
  DeviceTpFlags device_tp;              // --tp-comm, --tp-exchange-dtype: the device forward's exchange (tp > 1)
};

Result<KvPolicy> kv_policy_from_args(const GenerateArgs& a) {
  KvPolicy p;
  SNAP_ASSIGN_OR_RETURN(p.kind, kv_policy_from_name(a.kv.policy));
  p.budget = a.kv.budget;
  p.window = a.kv.window;
  p.kernel = a.kv.kernel;
  SNAP_ASSIGN_OR_RETURN(p.pooling, kv_pooling_from_name(a.kv.pooling));
  SNAP_ASSIGN_OR_RETURN(p.aggregation, gqa_aggregation_from_name(a.kv.gqa));
  p.num_sink = a.kv.sinks;
  p.layerwise = a.kv.layerwise;
  SNAP_RETURN_IF_ERROR(p.validate());
  return p;
}

// Tokens of the prompt that belong to the context: the longest common prefix of the full
// prompt's ids and the ids of the prompt text cut just before the question.
int64_t context_token_count(const Tokenizer& tok, const std::vector<int32_t>& full, const std::string& context,
                            bool chat) {
  std::vector<int32_t> prefix;
  if (chat) {
    auto templ = apply_chat_template(tok, {{"user", context + "\x01"}}, true);
    std::string t = templ.ok() ? templ.value() : context;
    t = t.substr(0, t.find('\x01'));
    prefix = tok.encode(t, false);
    if (tok.add_bos() && (prefix.empty() || prefix.front() != tok.bos_id())) prefix.insert(prefix.begin(), tok.bos_id());
  } else {
    prefix = prompt_ids_for_text(tok, context);
  }
  int64_t c = 0;
  while (c < static_cast<int64_t>(std::min(prefix.size(), full.size())) && prefix[c] == full[c]) ++c;
  return std::min<int64_t>(c, static_cast<int64_t>(full.size()) - 1);
}

// "2 x 30 layers x 1234 tokens x 576 x 4 B"
std::string all_reduce_formula(const ModelConfig& c, int64_t tokens, int element_bytes) {
  return "2 x " + std::to_string(c.num_layers) + " layers x " + std::to_string(tokens) + " tokens x " +
         std::to_string(c.hidden_size) + " hidden x " + std::to_string(element_bytes) + " B";
}

// The tensor-parallel lines of generate's report: what this rank holds and what it sent.
void report_tp(const comm::Communicator& comm, const LoadedModel& model, const GenerateStats& st,
               const comm::CommStats& after_prefill, const comm::CommStats& total, int element_bytes) {
  const auto& ar = total[comm::CommOp::all_reduce_sum];
  const auto& bc = total[comm::CommOp::broadcast];
  const int64_t decode_steps = std::max<int64_t>(st.generated_tokens - 1, 0);
  const int64_t forwarded = st.prompt_tokens + decode_steps;
  const double per_decode = decode_steps > 0 ? 1.0 / decode_steps : 0.0;
  std::fprintf(stderr,
               "snapserve: tensor parallel %d ranks (%s); rank 0 holds %s, %s of weights\n"
               "snapserve: sent by each rank: all_reduce_sum %lld calls, %lld bytes (= %s), broadcast (step plans) "
               "%lld calls, %lld bytes, all_gather %lld bytes\n"
               "snapserve: per decoded token: all_reduce_sum %.0f bytes, all_gather %.0f bytes (LM head logits), "
               "broadcast %.0f bytes; KV figures above are per rank\n"
               "snapserve: rank 0 time in collectives (waiting for the other ranks included): all_reduce_sum "
               "%.3f s, all_gather %.3f s, broadcast %.3f s = %.1f%% of prefill + decode\n",
               comm.group_size(), comm.backend_name(), model.shard.describe().c_str(),
               human_bytes(model.weights.nbytes()).c_str(), static_cast<long long>(ar.calls),
               static_cast<long long>(ar.bytes), all_reduce_formula(model.config, forwarded, element_bytes).c_str(),
               static_cast<long long>(bc.calls), static_cast<long long>(bc.bytes),
               static_cast<long long>(total[comm::CommOp::all_gather].bytes),
               (ar.bytes - after_prefill[comm::CommOp::all_reduce_sum].bytes) * per_decode,
               (total[comm::CommOp::all_gather].bytes - after_prefill[comm::CommOp::all_gather].bytes) * per_decode,
               (bc.bytes - after_prefill[comm::CommOp::broadcast].bytes) * per_decode, ar.seconds,
               total[comm::CommOp::all_gather].seconds, bc.seconds,
               100.0 * (ar.seconds + total[comm::CommOp::all_gather].seconds + bc.seconds) /
                   std::max(st.prefill_seconds + st.decode_seconds, 1e-9));
}

int run_generate_leader(const GenerateArgs& a, const LoadedModel& model, StepDriver* driver, DeviceGenerator* device,
                        double load_seconds);

// --device cuda[:N]: the whole model on one GPU (coordinator/engine/device_spec.h), or with
// tensor parallelism one shard per rank on its own GPU (`cuda`: local rank N -> cuda:N modulo
// the devices; `cuda:N`: that device on every rank). The tokenizer, prompt, sampling and the
// report stay on rank 0's host. The device is checked before anything is loaded, so a machine
// without one fails at once. With tp > 1 the launcher's host communicator (MPI or TCP, as on
// the CPU) carries each request's header and token ids; the forward's all-reduces and logits
// gathers go over NCCL (--tp-comm nccl) or through it, host-staged (--tp-comm host: ranks may
// share a GPU, which NCCL refuses).
int run_generate_device(const GenerateArgs& a) {
  auto parsed = parse_device(a.device);
  if (!parsed.ok()) return fail(parsed.status().message());
  if (const std::string e = device_dtype_error(parsed->name(), a.kv.dtype, a.weight_dtype); !e.empty()) return fail(e);
  auto launch = start_tensor_parallel("generate", a.parallel);
  if (!launch.ok()) return fail(launch.status().message());
  const comm::World& world = launch->world();
  const int size = world.size();
  std::unique_ptr<comm::Communicator> control = std::move(launch->comm);
  // This rank's device, checked before the model is read, and the forward's exchange: NCCL on
  // device buffers, or (null) the host communicator, staged.
  auto rank_device = open_rank_device(a.device, launch->launch, control.get(), a.device_tp, a.parallel.collective_timeout_s);
  if (!rank_device.ok()) return fail(rank_device.status().message());
  const DeviceSpec* dev = &rank_device->spec;
  std::unique_ptr<comm::Communicator> nccl = std::move(rank_device->exchange);
  comm::Communicator* exchange = nccl ? nccl.get() : control.get();
  auto policy = kv_policy_from_args(a);
  if (!policy.ok()) return fail(policy.status().message());
  LoadOptions opts = device_load_options(a.weight_dtype);
  opts.tp_rank = world.tp_rank();
  opts.tp_size = size;
  const double t_load = now_seconds();
  auto model = load_model(a.model, opts);
  Result<std::unique_ptr<DeviceGenerator>> device = model.ok() ? open_device_generator(*dev, *model, control.get(), exchange, rank_device->exchange_dtype)
                                                               : Result<std::unique_ptr<DeviceGenerator>>(model.status());
  // No rank goes on alone: a rank whose shard failed to load or upload tells the others here.
  const Status loaded = agree_on_load(control.get(), device.ok() ? Status() : device.status());
  if (!loaded.ok()) return fail(loaded.message());
  if (nccl) nccl->arm_collective_timeout();  // agree_on_load armed the control communicator
  if (size > 1 && !world.is_leader()) {
    const Status st = (*device)->follow();
    if (!st.ok()) return fail("rank " + std::to_string(world.rank()) + ": " + st.message());
    return 0;
  }
  const int rc = run_generate_leader(a, *model, nullptr, device->get(), now_seconds() - t_load);
  const Status st = (*device)->shutdown();
  if (!st.ok() && rc == 0) return fail(st.message());
  return rc;
}

// Every rank: find its place in the launcher's world, load its shard, agree that all ranks
// loaded, then rank 0 leads (run_generate_leader) and the others run plans until it is done.
int run_generate(const GenerateArgs& a) {
  if (a.device != "cpu") return run_generate_device(a);
  if (a.device_tp.exchange_dtype != "f32")
    return fail("--tp-exchange-dtype bf16 is for --device cuda (the CPU's all-reduces are f32)");
  auto launch = start_tensor_parallel("generate", a.parallel);
  if (!launch.ok()) return fail(launch.status().message());
  const comm::World* world = &launch->world();
  const int size = world->size();
  std::unique_ptr<comm::Communicator> comm = std::move(launch->comm);
  auto policy = kv_policy_from_args(a);  // checked on every rank before loading
  if (!policy.ok()) return fail(policy.status().message());

  LoadOptions opts;  // auto: block-format (q8_0 .. q2_k) matrices stay native, the rest f32
  const Status named = apply_weight_dtype(a.weight_dtype, &opts);  // checked by the flag
  if (!named.ok()) return fail(named.message());
  opts.tp_rank = world->tp_rank();
  opts.tp_size = size;
  const double t_load = now_seconds();
  auto model = load_model(a.model, opts);
  const double load_seconds = now_seconds() - t_load;
  // No rank goes on alone: a rank whose shard failed to load tells the others here.
  Status loaded = agree_on_load(comm.get(), model.ok() ? Status() : model.status());
  if (!loaded.ok()) return fail(loaded.message());
  LlamaForward forward(*model, comm.get());
  Worker worker(forward);
  if (!world->is_leader()) {
    Status st = worker_loop(worker, *comm);
    if (!st.ok()) return fail("rank " + std::to_string(world->rank()) + ": " + st.message());
    return 0;
  }
  StepDriver driver(worker, comm.get());
  const int rc = run_generate_leader(a, *model, &driver, nullptr, load_seconds);
  Status st = driver.shutdown();
  if (!st.ok() && rc == 0) return fail(st.message());
  return rc;
}

int run_generate_leader(const GenerateArgs& a, const LoadedModel& model_ref, StepDriver* driver, DeviceGenerator* device,
                        double load_seconds) {
  const LoadedModel* model = &model_ref;
  std::string text = a.prompt;
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file, std::ios::binary);
    if (!in) return fail(a.prompt_file + ": cannot read prompt file");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }

  const double t_tok = now_seconds();
  const int64_t rss_before_tokenizer = current_rss_bytes();
  auto tok = Tokenizer::load_for_model(a.model);
  if (!tok.ok()) return fail(tok.status().message());
  const int64_t tokenizer_bytes = current_rss_bytes() - rss_before_tokenizer;
  load_seconds += now_seconds() - t_tok;

  GenerateRequest req;
  req.kv_policy = kv_policy_from_args(a).value();  // checked by run_generate
  req.kv_pool_bytes = a.kv_cache_mib * 1024 * 1024;
  req.kv_dtype = kv_dtype_from_name(a.kv.dtype).value();  // checked by the flag
  // With --question the prompt is context + question, and the context alone is compressed
  // before the question is prefilled (question-agnostic compression).
  auto build = [&](const std::string& body) -> Result<std::vector<int32_t>> {
    if (!a.chat) return prompt_ids_for_text(*tok, body);
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", body});
    return prompt_ids_for_chat(*tok, msgs);
  };
  auto ids = build(a.question.empty() ? text : text + "\n\n" + a.question);
  if (!ids.ok()) return fail(ids.status().message());
  req.prompt_ids = std::move(ids).value();
  if (!a.question.empty()) {
    req.kv_policy.context_tokens = context_token_count(*tok, req.prompt_ids, text + "\n\n", a.chat);
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

  req.kv_selection_dump = a.dump_kv_selection;
  std::unique_ptr<LogitsDumpWriter> dump;
  GenerateHooks hooks;
  if (!a.dump_logits.empty()) {
    auto w = LogitsDumpWriter::open(a.dump_logits, req.prompt_ids, model->config.vocab_size);
    if (!w.ok()) return fail(w.status().message());
    dump.reset(w.value());
    hooks.on_prompt_logits = [&](int64_t, const float* row) { dump->write_row(row); };
  }
  const comm::Communicator* comm = driver ? driver->comm() : device ? device->exchange_comm() : nullptr;
  comm::CommStats after_prefill;
  hooks.on_prefilled = [&](const PagedKvCache&) {
    if (comm) after_prefill = comm->stats();
  };
  StreamDecoder decoder(*tok, true);
  const std::vector<int32_t>& stops = req.stop_ids;
  hooks.on_token = [&](int32_t id) {
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) return true;  // not printed
    const std::string piece = decoder.push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  };

  auto result = device ? device->generate(req, hooks) : generate(*driver, req, hooks);
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
               "snapserve: model %s (%s, %s weights: projections %s, lm_head %s), load %.2f s, %d threads, simd %s\n"
               "snapserve: prompt tokens %lld, prefill %.2f s (%.1f tok/s)\n"
               "snapserve: generated tokens %lld (finish: %s), decode %.2f s (%.1f tok/s)\n"
               "snapserve: kv policy %s: resident %s, full-equivalent %s (%.2fx), pool peak %s, selection %.3f s (%.2f%% of prefill)\n"
               "snapserve: peak RSS %s\n",
               model->config.name.c_str(), model->format.c_str(), human_bytes(model->weights.nbytes()).c_str(),
               dtype_name(model->weights.layers[0].q_proj.dtype()), dtype_name(model->weights.output().dtype()), load_seconds, omp_get_max_threads(), kernels::simd_level_name(),
               static_cast<long long>(st.prompt_tokens), st.prefill_seconds,
               st.prompt_tokens / std::max(st.prefill_seconds, 1e-9), static_cast<long long>(st.generated_tokens),
               result->finish_reason.c_str(), st.decode_seconds, decode_tps, req.kv_policy.describe().c_str(),
               human_bytes(st.kv_resident_bytes).c_str(), human_bytes(st.kv_full_equivalent_bytes).c_str(),
               st.kv_full_equivalent_bytes / std::max<double>(1, st.kv_resident_bytes),
               human_bytes(st.kv_pool_peak_bytes).c_str(), st.selection_seconds,
               100.0 * st.selection_seconds / std::max(st.prefill_seconds, 1e-9), human_bytes(peak_rss_bytes()).c_str());
  if (!device) {  // how the CPU ran: the decode matvec, the weights' layout, the OpenMP wait policy
    const bool tiles = model->weights.layers[0].q_proj.layout() == kernels::WeightLayout::tiles4;
    std::fprintf(stderr, "snapserve: cpu: matvec %s on %s (weights %s), threads wait %s\n",
                 kernels::matvec_act_name(kernels::matvec_act()), kernels::matvec_act_tiles_name(),
                 tiles ? "in 4-row tiles" : "row-major",
                 kernels::threads_wait_describe().c_str());
  }
  // Where the bytes go (this rank): weights as loaded, the KV pool's high-water mark, the
  // forward pass's activation scratch at its largest, the tokenizer (RSS growth while loading it).
  std::fprintf(stderr, "snapserve: memory: weights %s, KV peak %s (%s K/V, %s prefill), scratch peak %s, tokenizer %s\n",
               human_bytes(model->weights.nbytes()).c_str(), human_bytes(st.kv_pool_peak_bytes).c_str(),
               dtype_name(st.kv_dtype), st.layerwise ? (req.kv_policy.layerwise ? "layer-wise" : "layer-wise (auto: lower peak)") : "chunked",
               human_bytes(st.scratch_peak_bytes).c_str(), human_bytes(std::max<int64_t>(0, tokenizer_bytes)).c_str());
  if (device) std::fprintf(stderr, "snapserve: %s\n", device->describe_memory().c_str());
  if (device && comm) after_prefill = device->exchange_after_prefill();
  if (comm && comm->group_size() > 1)
    report_tp(*comm, *model, st, after_prefill, device ? device->exchange_at_end() : comm->stats(),
              device && a.device_tp.exchange_dtype == "bf16" ? 2 : 4);
  return 0;
}

// --- inspect -------------------------------------------------------------------

template <typename T>
std::string comma_join(const std::vector<T>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string dims_string(const std::vector<int64_t>& d) { return "[" + comma_join(d) + "]"; }

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
  if (c.sliding_window > 0 && c.sliding_window_pattern > 0) {  // gemma3: local and global layers
    std::vector<int> global_layers;
    for (int l = 0; l < c.num_layers; ++l) {
      if (!c.layer_is_local(l)) global_layers.push_back(l);
    }
    const int local = c.num_layers - static_cast<int>(global_layers.size());
    const std::string global = comma_join(global_layers);
    std::printf("layer kinds        %d local (window %d, rope theta %g), %d global (layers %s)\n", local,
                c.sliding_window, c.rope_local_theta > 0.0f ? c.rope_local_theta : c.rope.theta,
                c.num_layers - local, global.empty() ? "none" : global.c_str());
  }
  const std::string stops = comma_join(c.eos_token_ids);
  std::printf("stop token ids     %s\n", stops.empty() ? "none" : stops.c_str());
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
  // First: libgomp's wait policy can only change by restarting with it in the environment.
  if (const int rc = kernels::threads_wait_setup(argc, argv)) return rc;
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
  add_tp_options(gen, g.parallel, "generate");
  gen->add_option("--device", g.device,
                  "Where the model runs: cpu (default; the reference) or cuda / cuda:N (the whole model on GPU N: "
                  "bf16 weights and KV cache, every kv policy; fails at once "
                  "without a GPU or in a build without CUDA). With --tp N (mpirun, srun or --rank/--world-size) each "
                  "rank runs its shard on its GPU: cuda = the rank's local rank, cuda:N = GPU N on every rank");
  add_device_tp_options(gen, g.device_tp);
  gen->add_option("--prefill-chunk", g.prefill_chunk, "Prompt tokens per prefill step (default 512)")->check(CLI::Range(1, 1 << 20));
  add_weight_dtype_option(gen, g.weight_dtype);

  gen->add_option("--question", g.question,
                  "Question appended after the prompt (the context); with a compressing --kv-policy the context "
                  "alone is compressed before the question is prefilled (question-agnostic)");
  gen->add_option("--kv-policy", g.kv.policy, "KV cache policy: full (default), snapkv, streaming, h2o, pyramidkv, adakv")
      ->check(CLI::IsMember({"full", "snapkv", "streaming", "h2o", "pyramidkv", "adakv"}));
  add_kv_options(gen, g.kv);
  gen->add_option("--kv-cache-mib", g.kv_cache_mib,
                  "KV block pool size in MiB (default: enough for the uncompressed prompt + max tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  gen->add_option("--dump-kv-selection", g.dump_kv_selection,
                  "Write the kept prompt positions per layer and KV head to FILE (JSON; with --tp N > 1 each "
                  "rank writes FILE.rank<r> for its own KV heads)");

  std::string inspect_model = default_model_path();
  bool inspect_tensors = false;
  auto* ins = app.add_subcommand("inspect", "Print a model's configuration and tensor table");
  ins->add_option("--model", inspect_model, "GGUF file or Hugging Face directory");
  ins->add_flag("--tensors", inspect_tensors, "List every tensor");

  ServeArgs serve_args;
  add_serve_subcommand(app, serve_args);
  BenchServeArgs bench_args;
  add_bench_subcommand(app, bench_args);
  BatchArgs batch_args;
  const BatchCommands batch = add_batch_subcommand(app, batch_args);
  // `eval`: long-context quality tasks (eval/longctx) and versioned scorers (eval/scoring).
  // Each module registers its nested subcommands on this parent; their callbacks run the
  // command and set eval_rc.
  auto* eval = app.add_subcommand("eval", "Long-context quality tasks and versioned scorers");
  eval->require_subcommand(1);
  int eval_rc = 0;
  snap::scoring::add_scoring_eval_commands(*eval, &eval_rc);
  eval::add_longctx_eval_commands(*eval, &eval_rc);

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) known |= sub->get_name() == argv[1];
    if (!known) {
      std::fprintf(stderr, "snapserve: error: unknown subcommand '%s' (expected: generate, serve, batch, eval, bench, inspect; see --help)\n",
                   argv[1]);
      return 2;
    }
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
  const auto run = [&]() -> int {
    if (*gen) {
      if (g.prompt.empty() && g.prompt_file.empty()) return snap::fail("generate needs --prompt TEXT or --prompt-file F");
      return run_generate(g);
    }
    if (*ins) return run_inspect(inspect_model, inspect_tensors);
    if (app.got_subcommand("serve")) return run_serve(serve_args);
    if (app.got_subcommand("bench")) return run_bench_serve(bench_args);
    if (*batch.merge) return run_batch_merge(batch_args);
    if (*batch.batch) return run_batch(batch_args);
    if (*eval) return eval_rc;
    return 0;
  };
  try {
    return run();
  } catch (const std::bad_alloc&) {
    // Past the loader's own check (the weights fit): a later allocation found no memory. One
    // line and exit 1, as every other failure, instead of std::terminate's abort.
    return snap::fail("out of memory: an allocation failed" + snap::memory_left_phrase() +
                      "; a smaller --kv-cache-mib, --weight-dtype q8_0 or more memory would help");
  }
}
