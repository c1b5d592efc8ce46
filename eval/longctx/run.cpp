// `snapserve eval run` and `eval tasks` (see eval_cli.h). The runner builds each case's task
// on the thread that sends it (tokenizing is the only CPU work outside the engine), keeps
// --concurrency requests in flight, and appends one JSON record per finished case to the
// output with a flush; a rerun skips every case whose key is already there (a torn last
// line is cut first), so a killed sweep resumes where it stopped. Failed requests are not
// recorded: they run again on the next attempt and make the exit code 1.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/sha256.h"
#include "common/sys.h"
#include "eval/longctx/backends.h"
#include "eval/longctx/eval_cli.h"
#include "eval/longctx/report.h"
#include "worker/model/config.h"
#include "worker/model/gguf.h"
#include "snap_git_commit.h"

namespace snap::eval {

namespace {

using nlohmann::json;

int eval_fail(const std::string& message) {
  std::fprintf(stderr, "snapserve eval: error: %s\n", message.c_str());
  return 1;
}

json policy_json(const KvPolicy& p) {
  json j = {{"name", kv_policy_name(p.kind)}};
  if (p.kind == KvPolicyKind::full) return j;
  j["budget"] = p.budget;
  if (p.kind == KvPolicyKind::streaming) {
    j["sinks"] = p.num_sink;
  } else if (p.kind != KvPolicyKind::h2o) {
    j["window"] = p.window;
    j["kernel"] = p.kernel;
    j["pooling"] = p.pooling == KvPooling::max ? "max" : "avg";
    j["gqa"] = p.aggregation == GqaAggregation::mean ? "mean" : "max";
  }
  return j;
}

// Keys of the complete records in path; a torn last line (no newline) is cut off the file.
Result<std::set<std::string>> resume_keys(const std::string& path, int64_t* cut_bytes) {
  std::set<std::string> keys;
  *cut_bytes = 0;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return keys;
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot read the output to resume it");
  std::string data((std::istreambuf_iterator<char>(in)), {});
  const size_t last_nl = data.rfind('\n');
  const size_t keep = last_nl == std::string::npos ? 0 : last_nl + 1;
  if (keep < data.size()) {
    *cut_bytes = static_cast<int64_t>(data.size() - keep);
    std::filesystem::resize_file(path, keep, ec);
    if (ec) return invalid_argument(path + ": cannot cut its torn last line: " + ec.message());
  }
  size_t start = 0, lineno = 0;
  while (start < keep) {
    const size_t nl = data.find('\n', start);
    const std::string line = data.substr(start, nl - start);
    start = nl + 1;
    ++lineno;
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("key") || !j["key"].is_string()) {
      return invalid_argument(path + ":" + std::to_string(lineno) + ": not an eval record (move the file away)");
    }
    keys.insert(j["key"].get<std::string>());
  }
  return keys;
}

// " kv=f16" for a KV element type other than f32 (in process), appended to keys and labels.
std::string kv_dtype_suffix(const RunArgs& a) {
  return a.url.empty() && a.kv_dtype != "f32" ? " kv=" + a.kv_dtype : "";
}

struct Shared {
  const std::vector<EvalCase>* cases = nullptr;
  const Tokenizer* tok = nullptr;
  const TextCorpus* corpus = nullptr;
  EvalBackend* backend = nullptr;
  const RunArgs* args = nullptr;
  json provenance;
  std::FILE* out = nullptr;
  std::mutex mu;
  std::atomic<size_t> next{0};
  int64_t done = 0, correct = 0, failed = 0;
  std::string first_error;
  double t0 = 0, last_progress = 0;
};

void run_one(Shared& s, const EvalCase& c) {
  const bool chat = !s.args->no_chat;
  auto task = make_task(c.task, *s.tok, s.corpus, chat);
  CompletionJob job;
  Result<Completion> done = invalid_argument("unset");
  if (task.ok()) {
    job.prompt_ids = task->prompt_ids;
    job.prompt_text = task->prompt_text;
    job.max_tokens = s.args->max_tokens > 0 ? s.args->max_tokens : task_default_max_tokens(c.task.kind);
    job.policy = c.policy;
    if (c.placement == Placement::context_only) job.policy.context_tokens = task->context_tokens;
    job.send_policy = !s.args->server_policy;
    done = s.backend->complete(job);
  } else {
    done = task.status();
  }
  std::lock_guard<std::mutex> lock(s.mu);
  if (!done.ok()) {
    ++s.failed;
    if (s.first_error.empty()) s.first_error = c.key + ": " + done.status().message();
    std::fprintf(stderr, "snapserve eval: %s: %s\n", c.key.c_str(), done.status().message().c_str());
    return;
  }
  const AnswerScore score = score_answer(task->scorer, done->text, task->expected);
  json r = {{"key", c.key},
            {"task", task_name(c.task.kind)},
            {"haystack", haystack_name(c.task.haystack)},
            {"length", c.task.length},
            {"depth", c.task.depth_percent},
            {"seed", c.task.seed},
            {"placement", placement_name(c.placement)},
            {"policy", policy_json(c.policy)},
            {"policy_label", s.args->server_policy ? "server" : policy_label(c.policy) + kv_dtype_suffix(*s.args)},
            {"policy_family", s.args->server_policy ? "server" : policy_family(c.policy) + kv_dtype_suffix(*s.args)},
            {"kv_dtype", s.args->url.empty() ? s.args->kv_dtype : "server"},
            {"prompt_tokens", static_cast<int64_t>(task->prompt_ids.size())},
            {"context_tokens", task->context_tokens},
            {"served_prompt_tokens", done->prompt_tokens},
            {"prompt_sha256", task->prompt_sha256},
            {"chat", chat},
            {"needles", task->needles},
            {"needle_tokens", task->needle_tokens},
            {"expected", task->expected},
            {"scorer", score_kind_name(task->scorer)},
            {"output", done->text},
            {"finish_reason", done->finish_reason},
            {"completion_tokens", done->completion_tokens},
            {"max_tokens", job.max_tokens},
            {"correct", score.correct},
            {"partial", score.partial},
            {"kv_resident_bytes", done->kv_resident_bytes},
            {"kv_full_equivalent_bytes", done->kv_full_equivalent_bytes},
            {"seconds", done->seconds}};
  for (auto& [k, v] : s.provenance.items()) r[k] = v;
  const std::string line = r.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), s.out);
  std::fflush(s.out);
  ++s.done;
  s.correct += score.correct ? 1 : 0;
  const double now = now_seconds();
  if (now - s.last_progress >= s.args->progress_interval) {
    s.last_progress = now;
    const double per = (now - s.t0) / static_cast<double>(s.done);
    const double left = static_cast<double>(s.cases->size() - s.done - s.failed) * per;
    std::fprintf(stderr, "snapserve eval: %lld/%zu done, %lld correct, %lld failed, %.1f s/case, ETA %.0f s\n",
                 static_cast<long long>(s.done), s.cases->size(), static_cast<long long>(s.correct),
                 static_cast<long long>(s.failed), per, left);
  }
}

// Accuracy per (task, placement, policy, length), pooled over depths and seeds.
void print_summary(const std::string& path) {
  auto recs = load_records({path});
  if (!recs.ok()) return;
  std::map<std::string, std::pair<int64_t, int64_t>> cells;
  for (const EvalRecord& r : *recs) {
    auto& c = cells[r.task + " " + r.placement + " L" + std::to_string(r.length) + " | " + r.policy_label];
    c.first += r.correct ? 1 : 0;
    c.second += 1;
  }
  std::printf("%-72s %9s %8s %17s\n", "task placement length | policy", "correct", "acc", "wilson 95%");
  for (const auto& [k, v] : cells) {
    const Interval ci = wilson_interval(v.first, v.second);
    std::printf("%-72s %4lld/%-4lld %7.1f%% [%5.1f%%, %5.1f%%]\n", k.c_str(), static_cast<long long>(v.first),
                static_cast<long long>(v.second), 100.0 * v.first / v.second, 100 * ci.lo, 100 * ci.hi);
  }
}

struct Prepared {
  std::vector<EvalCase> cases;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<TextCorpus> corpus;
};

// The model's context in tokens (GGUF context_length / config.json max_position_embeddings),
// 0 where the file does not say.
Result<int64_t> model_context_tokens(const std::string& model) {
  std::error_code ec;
  if (std::filesystem::is_directory(model, ec)) {
    const std::string cfg = (std::filesystem::path(model) / "config.json").string();
    if (!std::filesystem::exists(cfg, ec)) return int64_t{0};
    SNAP_ASSIGN_OR_RETURN(ModelConfig c, config_from_hf_json(cfg));
    return c.max_position;
  }
  SNAP_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(model));
  SNAP_ASSIGN_OR_RETURN(ModelConfig c, config_from_gguf(f));
  return c.max_position;
}

Result<Prepared> prepare(const RunArgs& a) {
  Prepared p;
  SNAP_ASSIGN_OR_RETURN(p.cases, sweep_cases(a.sweep));
  auto tok = Tokenizer::load_for_model(a.model);
  if (!tok.ok()) return tok.status();
  p.tok = std::make_unique<Tokenizer>(std::move(tok).value());
  // A prompt fitted to the model's whole context would leave no room for the answer (the
  // engine stops at the context: an 8,191-token SmolLM2 prompt got one new token). Fit each
  // prompt to the context less its new tokens; shorter lengths are unaffected.
  SNAP_ASSIGN_OR_RETURN(int64_t context, model_context_tokens(a.model));
  if (context > 0) {
    for (auto& c : p.cases) {
      const int64_t new_tokens = a.max_tokens > 0 ? a.max_tokens : task_default_max_tokens(c.task.kind);
      if (context > new_tokens) c.task.max_prompt_tokens = context - new_tokens;
    }
  }
  bool need_corpus = false;
  for (const auto& c : p.cases) need_corpus |= c.task.haystack == HaystackKind::shakespeare;
  if (need_corpus) {
    SNAP_ASSIGN_OR_RETURN(TextCorpus corpus, TextCorpus::load(a.haystack_dir));
    p.corpus = std::make_unique<TextCorpus>(std::move(corpus));
  }
  return p;
}

}  // namespace

int run_eval(const RunArgs& args) {
  RunArgs a = args;
  if (a.output.empty()) return eval_fail("eval run needs --output FILE.jsonl");
  if (a.server_policy && a.url.empty()) return eval_fail("--server-policy needs --url");
  if (a.server_policy) a.sweep.policies = "full";  // one case per task: the server's own KV handling
  if (!a.url.empty() && a.url.rfind("http://", 0) != 0) return eval_fail("--url '" + a.url + "' must start with http://");
  if (!a.url.empty() && a.kv_dtype != "f32") {
    return eval_fail("--kv-dtype " + a.kv_dtype + " sets the in-process engine's KV type; with --url the server "
                     "chooses its own (drop --kv-dtype, or start the server with it)");
  }
  auto kv_dtype = kv_dtype_from_name(a.kv_dtype);
  if (!kv_dtype.ok()) return eval_fail("--kv-dtype: " + kv_dtype.status().message());
  a.kv_dtype = dtype_name(*kv_dtype);  // "" is the default, f32
  auto prep = prepare(a);
  if (!prep.ok()) return eval_fail(prep.status().message());
  for (auto& c : prep->cases) c.key += kv_dtype_suffix(a);
  if (!a.url.empty()) {
    for (const auto& c : prep->cases) {
      if (c.placement == Placement::context_only) {
        return eval_fail("--placements context_only needs the in-process engine: the OpenAI API cannot say where "
                         "the context ends (drop --url or use --placements after)");
      }
    }
  }
  int64_t cut = 0;
  auto have = resume_keys(a.output, &cut);
  if (!have.ok()) return eval_fail(have.status().message());
  std::vector<EvalCase> todo;
  for (const auto& c : prep->cases) {
    if (!have->count(c.key)) todo.push_back(c);
  }
  std::fprintf(stderr, "snapserve eval: %zu cases, %zu already in %s%s, %zu to run (%s)\n", prep->cases.size(),
               prep->cases.size() - todo.size(), a.output.c_str(),
               cut > 0 ? (", a torn last line of " + std::to_string(cut) + " bytes cut").c_str() : "", todo.size(),
               a.url.empty() ? "in process" : a.url.c_str());

  json prov = {{"snapserve_commit", SNAP_GIT_COMMIT}};
  auto model_sha = sha256_file(a.model);
  if (!model_sha.ok()) return eval_fail(model_sha.status().message());
  prov[a.url.empty() ? "model_sha256" : "tokenizer_model_sha256"] = *model_sha;
  prov["model_file"] = std::filesystem::path(a.model).filename().string();
  if (prep->corpus) prov["haystack_sha256"] = prep->corpus->fingerprint();

  std::unique_ptr<EvalBackend> backend;
  if (!todo.empty()) {
    if (a.url.empty()) {
      EngineBackendOptions o;
      o.model_path = a.model;
      o.threads = a.threads;
      o.kv_cache_mib = a.kv_cache_mib;
      o.max_num_seqs = a.concurrency;
      o.prefill_chunk = a.prefill_chunk;
      o.kv_dtype = *kv_dtype;
      auto b = make_engine_backend(o);
      if (!b.ok()) return eval_fail(b.status().message());
      backend = std::move(b).value();
    } else {
      UrlBackendOptions o;
      o.url = a.url;
      o.api_key = a.api_key;
      o.model = a.served_model;
      o.chat = !a.no_chat;
      o.timeout_s = a.timeout_s;
      auto b = make_url_backend(o);
      if (!b.ok()) return eval_fail(b.status().message());
      backend = std::move(b).value();
    }
    prov["backend"] = backend->describe();
    prov["served_model"] = backend->model_name();
  }

  Shared s;
  s.cases = &todo;
  s.tok = prep->tok.get();
  s.corpus = prep->corpus.get();
  s.backend = backend.get();
  s.args = &a;
  s.provenance = prov;
  s.t0 = s.last_progress = now_seconds();
  if (!todo.empty()) {
    s.out = std::fopen(a.output.c_str(), "ab");
    if (!s.out) return eval_fail(a.output + ": cannot open for appending");
    std::vector<std::thread> threads;
    for (int i = 0; i < std::max(1, a.concurrency); ++i) {
      threads.emplace_back([&s] {
        for (size_t k = s.next++; k < s.cases->size(); k = s.next++) run_one(s, (*s.cases)[k]);
      });
    }
    for (auto& t : threads) t.join();
    std::fclose(s.out);
    backend->shutdown();
    std::fprintf(stderr, "snapserve eval: finished: %lld recorded, %lld correct, %lld failed, %.1f s\n",
                 static_cast<long long>(s.done), static_cast<long long>(s.correct), static_cast<long long>(s.failed),
                 now_seconds() - s.t0);
  }
  print_summary(a.output);
  if (s.failed > 0) {
    return eval_fail(std::to_string(s.failed) + " cases failed (not recorded; run the same command again to retry "
                     "them); first: " + s.first_error);
  }
  return 0;
}

int run_eval_tasks(const RunArgs& a) {
  auto prep = prepare(a);
  if (!prep.ok()) return eval_fail(prep.status().message());
  std::FILE* out = stdout;
  if (!a.output.empty() && a.output != "-") {
    out = std::fopen(a.output.c_str(), "wb");
    if (!out) return eval_fail(a.output + ": cannot open for writing");
  }
  std::set<std::string> seen;  // one task per spec: policies and placements share it
  for (const auto& c : prep->cases) {
    const std::string id = std::string(task_name(c.task.kind)) + "|" + haystack_name(c.task.haystack) + "|" +
                           std::to_string(c.task.length) + "|" + std::to_string(c.task.depth_percent) + "|" +
                           std::to_string(c.task.seed);
    if (!seen.insert(id).second) continue;
    auto t = make_task(c.task, *prep->tok, prep->corpus.get(), !a.no_chat);
    if (!t.ok()) return eval_fail(t.status().message());
    json j = {{"task", task_name(c.task.kind)},   {"haystack", haystack_name(c.task.haystack)},
              {"length", c.task.length},          {"depth", c.task.depth_percent},
              {"seed", c.task.seed},              {"prompt_tokens", static_cast<int64_t>(t->prompt_ids.size())},
              {"context_tokens", t->context_tokens}, {"prompt_sha256", t->prompt_sha256},
              {"needles", t->needles},            {"needle_tokens", t->needle_tokens},
              {"expected", t->expected},
              {"scorer", score_kind_name(t->scorer)}, {"question", t->question},
              {"prompt", t->prompt_text}};
    const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), out);
  }
  if (out != stdout) std::fclose(out);
  return 0;
}

}  // namespace snap::eval
