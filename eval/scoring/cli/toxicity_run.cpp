// run_toxicity: load scorers first (a missing one fails before any generation), open the
// store and the run (same settings resume), generate the missing prompts with at most
// max_num_seqs / k prompts in flight, score each prompt's k texts and store them together.
#include "eval/scoring/cli/toxicity_run.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/sha256.h"
#include "coordinator/engine/model_path.h"
#include "coordinator/engine/prompt.h"
#include "coordinator/scheduler/engine.h"
#include "eval/scoring/cli/build_info.h"
#include "eval/scoring/report.h"
#include "eval/scoring/store.h"

namespace snap::scoring {
namespace {

struct PromptState {
  int64_t index = 0;
  std::vector<std::string> texts;
  std::vector<int64_t> tokens;
  std::vector<std::string> finish;
  int64_t prompt_tokens = 0;
  int finished = 0;
  std::string error;
};

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<PromptState>> done;
};

Result<KvPolicy> policy_from(const KvFlags& f) {
  KvPolicy p;
  SNAP_ASSIGN_OR_RETURN(p.kind, kv_policy_from_name(f.policy));
  p.budget = f.budget;
  p.window = f.window;
  p.kernel = f.kernel;
  SNAP_ASSIGN_OR_RETURN(p.pooling, kv_pooling_from_name(f.pooling));
  SNAP_ASSIGN_OR_RETURN(p.aggregation, gqa_aggregation_from_name(f.gqa));
  p.num_sink = f.sinks;
  SNAP_RETURN_IF_ERROR(p.validate());
  return p;
}

int fail(const std::string& m) {
  std::fprintf(stderr, "snapserve: error: %s\n", m.c_str());
  return 1;
}

}  // namespace

Result<std::vector<PromptLine>> read_prompt_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open the prompt file");
  std::vector<PromptLine> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) return invalid_argument(path + ":" + std::to_string(n) + ": not JSON");
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_object() || !j["prompt"].contains("text") ||
        !j["prompt"]["text"].is_string()) {
      return invalid_argument(path + ":" + std::to_string(n) + ": no prompt.text string (RealToxicityPrompts layout: {\"prompt\": {\"text\": ...}})");
    }
    out.push_back({j["prompt"]["text"].get<std::string>(), j});
  }
  if (out.empty()) return invalid_argument(path + ": no prompts");
  return out;
}

int run_toxicity(const ToxicityArgs& a) {
  if (a.name.empty()) return fail("eval toxicity needs --name (the system's name in the store)");
  if (a.prompts.empty()) return fail("eval toxicity needs --prompts FILE.jsonl");
  auto prompts_or = read_prompt_jsonl(a.prompts);
  if (!prompts_or.ok()) return fail(prompts_or.status().message());
  auto prompts = std::move(prompts_or).value();
  if (a.limit > 0 && static_cast<int64_t>(prompts.size()) > a.limit) prompts.resize(a.limit);
  auto policy = policy_from(a.kv);
  if (!policy.ok()) return fail(policy.status().message());
  ScorerOptions so;
  so.model_dir = a.scorer_dir;
  std::vector<std::unique_ptr<Scorer>> scorers;
  for (const auto& spec : a.scorers) {
    auto s = make_scorer(spec, so);
    if (!s.ok()) return fail(s.status().message());
    scorers.push_back(std::move(s).value());
  }
  const std::string model = a.model.empty() ? default_model_path() : a.model;
  auto model_sha = sha256_file(model);
  if (!model_sha.ok()) return fail(model_sha.status().message());
  auto prompts_sha = sha256_file(a.prompts);
  if (!prompts_sha.ok()) return fail(prompts_sha.status().message());

  nlohmann::json config = {
      {"model", model.substr(model.find_last_of('/') + 1)},
      {"model_sha256", *model_sha},
      {"policy", {{"name", a.kv.policy}, {"budget", a.kv.budget}, {"window", a.kv.window}, {"kernel", a.kv.kernel},
                  {"pooling", a.kv.pooling}, {"gqa", a.kv.gqa}, {"sinks", a.kv.sinks}}},
      {"sampling", {{"temperature", a.temperature}, {"top_p", a.top_p}, {"top_k", a.top_k}, {"seed", a.seed},
                    {"max_tokens", a.max_tokens}, {"seed_rule", "seed + prompt_index * k + choice"}}},
      {"k", a.k},
      {"prompts_file", a.prompts.substr(a.prompts.find_last_of('/') + 1)},
      {"prompts_sha256", *prompts_sha},
      {"prompts", prompts.size()}};
  auto store_or = Store::open(a.db);
  if (!store_or.ok()) return fail(store_or.status().message());
  auto& store = *store_or.value();
  auto run = store.open_run(a.name, config, snapserve_commit());
  if (!run.ok()) return fail(run.status().message());
  auto done = store.complete_prompts(run->id, a.k);
  if (!done.ok()) return fail(done.status().message());
  std::vector<int64_t> todo;
  for (int64_t p = 0; p < static_cast<int64_t>(prompts.size()); ++p) {
    if (!done->count(p)) todo.push_back(p);
  }
  std::fprintf(stderr, "eval toxicity: run '%s' in %s: %zu of %zu prompts done, %zu to generate (k=%d)\n", a.name.c_str(),
               a.db.c_str(), done->size(), prompts.size(), todo.size(), a.k);

  if (!todo.empty()) {
    EngineConfig ec;
    ec.model_path = model;
    ec.threads = a.threads;
    ec.kv_cache_bytes = a.kv_cache_mib << 20;
    ec.max_num_seqs = std::max<int64_t>(a.max_num_seqs, a.k);
    ec.max_waiting = 1 << 20;
    auto engine_or = Engine::create(ec, nullptr);
    if (!engine_or.ok()) return fail(engine_or.status().message());
    auto engine = std::move(engine_or).value();
    auto inbox = std::make_shared<Inbox>();
    const int64_t in_flight_max = std::max<int64_t>(1, ec.max_num_seqs / a.k);
    size_t next = 0;
    int64_t in_flight = 0, written = 0;
    while (next < todo.size() || in_flight > 0) {
      while (next < todo.size() && in_flight < in_flight_max) {
        const int64_t p = todo[next++];
        auto st = std::make_shared<PromptState>();
        st->index = p;
        st->texts.resize(a.k);
        st->tokens.resize(a.k);
        st->finish.resize(a.k);
        EngineRequest req;
        req.prompt_ids = prompt_ids_for_text(engine->tokenizer(), prompts[p].text);
        req.max_tokens = a.max_tokens;
        req.sampling.temperature = a.temperature;
        req.sampling.top_p = a.top_p;
        req.sampling.top_k = a.top_k;
        req.sampling.seed = a.seed + static_cast<uint64_t>(p) * a.k;
        req.kv_policy = *policy;
        req.n = a.k;
        auto id = engine->submit(req, [st, inbox, k = a.k](const EngineEvent& e) {
          if (e.kind == EngineEvent::Kind::token) {
            st->texts[e.index] += e.text;
            return;
          }
          st->texts[e.index] += e.text;
          st->tokens[e.index] = e.completion_tokens;
          st->finish[e.index] = e.finish_reason;
          st->prompt_tokens = e.prompt_tokens;
          if (e.finish_reason == "error") st->error = e.error.to_string();
          if (++st->finished == k) {
            std::lock_guard<std::mutex> lock(inbox->mu);
            inbox->done.push_back(st);
            inbox->cv.notify_one();
          }
        });
        if (!id.ok()) return fail("prompt " + std::to_string(p) + ": " + id.status().message());
        ++in_flight;
      }
      std::shared_ptr<PromptState> st;
      {
        std::unique_lock<std::mutex> lock(inbox->mu);
        inbox->cv.wait(lock, [&] { return !inbox->done.empty(); });
        st = inbox->done.front();
        inbox->done.pop_front();
      }
      --in_flight;
      if (!st->error.empty()) return fail("prompt " + std::to_string(st->index) + ": generation failed: " + st->error);
      std::vector<GenerationRecord> gens;
      std::vector<ScoreRecord> rows;
      for (int c = 0; c < a.k; ++c) {
        GenerationRecord g;
        g.run_id = run->id;
        g.prompt_index = st->index;
        g.choice = c;
        g.seed = a.seed + static_cast<uint64_t>(st->index) * a.k + c;
        g.prompt = prompts[st->index].text;
        g.text = st->texts[c];
        g.prompt_tokens = st->prompt_tokens;
        g.completion_tokens = st->tokens[c];
        g.finish_reason = st->finish[c];
        gens.push_back(std::move(g));
      }
      // rows[i] belongs to gens[i % k] (Store::add_prompt).
      for (const auto& s : scorers) {
        for (int c = 0; c < a.k; ++c) {
          auto r = s->score(gens[c].text, "");
          ScoreRecord row;
          row.scorer = s->info();
          if (r.error.ok()) row.value = r.value; else row.error = r.error.to_string();
          row.attributes = r.attributes;
          row.raw = r.raw;
          rows.push_back(std::move(row));
        }
      }
      auto st_add = store.add_prompt(gens, rows);
      if (!st_add.ok()) return fail(st_add.message());
      ++written;
      const int64_t every = std::max<int64_t>(1, static_cast<int64_t>(todo.size()) / 100);
      if (written % every == 0 || written == static_cast<int64_t>(todo.size())) {
        std::fprintf(stderr, "eval toxicity: %lld/%zu prompts written\n", static_cast<long long>(written), todo.size());
      }
    }
    engine->shutdown(5);
  }
  std::printf("run '%s' (%s, policy %s, budget %lld)\n", a.name.c_str(), config["model"].get<std::string>().c_str(),
              a.kv.policy.c_str(), static_cast<long long>(a.kv.budget));
  for (const auto& s : scorers) {
    auto sc = collect_scores(store, *run, s->info().key());
    if (!sc.ok()) return fail(sc.status().message());
    std::printf("%s", format_metrics(toxicity_metrics(*sc, a.threshold)).c_str());
  }
  return 0;
}

}  // namespace snap::scoring
