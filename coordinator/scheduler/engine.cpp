// The continuous-batching engine: one scheduler thread owns the model, the block pool and
// every sequence. Each step it (1) takes new requests and cancellations, (2) admits waiting
// requests whose KV reservation fits the pool, (3) runs one batched forward with one
// decode token per running sequence plus one prefill chunk of an admitted prompt,
// (4) compresses a sequence's KV the step its context is complete, (5) samples, detokenizes,
// applies stop strings and streams events. KV reservations: a sequence holds, in blocks,
// max(its prompt uncompressed — the prefill peak —, its compressed size + max_tokens); the
// reservation shrinks to the second term once compression ran, so admission is exact.
// The model, the pool and every sequence's KV live in a Worker; the engine reaches them
// only through StepPlans (open, forward, close) run by a StepDriver, so the same loop
// drives one process or a tensor-parallel group. Reservations count this rank's KV heads.
// Group faults: every plan runs under a GroupWatchdog deadline; a failed group finishes
// every open request through its SinkGate from whichever thread saw the failure first,
// since the scheduler thread may be stuck inside a collective for good.
// Out of memory: a std::bad_alloc inside a step (a long prompt's logits, scratch) ends the
// running requests with an error naming it and the loop goes on serving (one process; a
// tensor-parallel group fails as a whole, its ranks' states no longer agreeing).
#include "coordinator/scheduler/engine.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "common/sys.h"
#include "coordinator/engine/prefill_choice.h"
#include "coordinator/scheduler/group_watchdog.h"
#include "coordinator/scheduler/sink_gate.h"
#include "coordinator/scheduler/logits_processing.h"
#include "coordinator/scheduler/out_of_memory.h"
#include "coordinator/scheduler/token_stream.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/compressor.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"
#include "worker/worker.h"

namespace snap {
namespace {

struct Sequence : TokenStream {
  uint64_t id = 0;
  bool open = false;         // opened on the workers (its KV exists there)
  int64_t compress_at = 0;
  int64_t reserved_blocks = 0;
  bool compressed = false;
  bool layerwise_auto = false;  // req.kv_policy.layerwise was set by the engine (EngineConfig::auto_layerwise)
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineConfig& cfg, ServerMetrics* metrics) : cfg_(cfg), metrics_(metrics) {}
  ~EngineImpl() override { shutdown(0); }

  Status init() {
    comm::Communicator* comm = cfg_.comm;
    LoadOptions opts;
    SNAP_RETURN_IF_ERROR(apply_weight_dtype(cfg_.weight_dtype, &opts));
    if (comm) {
      opts.tp_rank = comm->group_rank();
      opts.tp_size = comm->group_size();
    }
    auto model = load_model(cfg_.model_path, opts);
    SNAP_RETURN_IF_ERROR(agree_on_load(comm, model.ok() ? Status() : model.status()));
    model_ = std::make_unique<LoadedModel>(std::move(model).value());
    forward_ = std::make_unique<LlamaForward>(*model_, comm);
    worker_ = std::make_unique<Worker>(*forward_);
    driver_ = std::make_unique<StepDriver>(*worker_, comm);  // from here the workers wait for plans
    if (comm && comm->group_size() > 1) {
      watchdog_ = std::make_unique<GroupWatchdog>(cfg_.step_timeout_seconds,
                                                  [this](const std::string& why) { fail_group(why); });
      driver_->set_internal_error_handler([this](const Status& st) { fail_group("rank 0: step failed: " + st.message()); });
    }
    auto tok = Tokenizer::load_for_model(cfg_.model_path);
    if (!tok.ok()) {
      shutdown_workers();
      return tok.status();
    }
    tokenizer_ = std::make_unique<Tokenizer>(std::move(tok).value());
    const ModelConfig& c = model_->config;
    StepPlan pool;
    pool.pool_bytes = cfg_.kv_cache_bytes;
    pool.block_size = cfg_.kv_block_size;
    pool.kv_dtype = cfg_.kv_dtype;
    pool.report = watchdog_ != nullptr;  // every rank's pid and host, for the watchdog
    std::vector<RankReport> reports;
    if (Status st = run_plan(pool, {}, &reports); !st.ok()) {
      shutdown_workers();
      return st;
    }
    if (watchdog_) {
      std::vector<GroupPeer> peers;
      std::string who;
      for (size_t r = 1; r < reports.size(); ++r) {
        const bool here = reports[r].host_id == reports[0].host_id;
        peers.push_back({static_cast<int>(r), reports[r].pid, here});
        who += ", rank " + std::to_string(r) + " pid " + std::to_string(reports[r].pid) + (here ? " (this host)" : "");
      }
      watchdog_->set_peers(std::move(peers));
      std::fprintf(stderr, "snapserve: tensor-parallel group of %zu: rank 0 pid %lld%s; step timeout %.1f s\n",
                   reports.size(), static_cast<long long>(current_pid()), who.c_str(), cfg_.step_timeout_seconds);
    }
    pool_ = worker_->pool();
    context_ = c.max_position > 0 ? c.max_position : (int64_t{1} << 30);
    max_prompt_ = cfg_.max_prompt_tokens > 0 ? std::min(cfg_.max_prompt_tokens, context_) : context_;
    max_tokens_limit_ = cfg_.max_tokens_limit > 0 ? cfg_.max_tokens_limit : context_;
    name_ = cfg_.served_model_name;
    if (name_.empty()) {
      name_ = cfg_.model_path;
      while (!name_.empty() && name_.back() == '/') name_.pop_back();
      name_ = name_.substr(name_.find_last_of('/') + 1);
    }
    for (int32_t id : tokenizer_->eos_ids()) eos_.push_back(id);
    for (int32_t id : c.eos_token_ids) eos_.push_back(id);
    alive_ = true;  // healthy from here: the model is loaded and the loop is starting
    heartbeat_ = now_seconds();
    thread_ = std::thread([this] { loop(); });
    return {};
  }

  // --- Engine -------------------------------------------------------------------------

  Result<uint64_t> submit(EngineRequest req, EventSink sink) override {
    const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
    if (n == 0) return invalid_argument("prompt is empty");
    if (n > max_prompt_) {
      return invalid_argument("prompt has " + std::to_string(n) + " tokens, more than the limit of " +
                              std::to_string(max_prompt_));
    }
    for (int32_t id : req.prompt_ids) {
      if (id < 0 || id >= model_->config.vocab_size) {
        return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary");
      }
    }
    const int64_t min_tokens_allowed = req.prompt_logprobs >= 0 ? 0 : 1;
    if (req.max_tokens < min_tokens_allowed || req.max_tokens > max_tokens_limit_) {
      return invalid_argument("max_tokens must be in [" + std::to_string(min_tokens_allowed) + ", " +
                              std::to_string(max_tokens_limit_) + "], got " + std::to_string(req.max_tokens));
    }
    if (req.prompt_logprobs > 20) return invalid_argument("prompt logprobs: at most 20 alternatives");
    if (req.prompt_logprobs >= 0 && req.kv_policy.layerwise) {
      return invalid_argument("prompt logprobs (echo) need every position's logits; layer-wise prefill gives only the last");
    }
    if (req.max_tokens == 0 && req.n > 1) return invalid_argument("n > 1 needs max_tokens >= 1");
    if (req.n < 1 || req.n > 64) return invalid_argument("n must be in [1, 64], got " + std::to_string(req.n));
    if (req.n > cfg_.max_num_seqs) {
      return invalid_argument("n = " + std::to_string(req.n) + " choices exceed --max-num-seqs " +
                              std::to_string(cfg_.max_num_seqs));
    }
    if (req.min_tokens < 0 || req.min_tokens > req.max_tokens) {
      return invalid_argument("min_tokens must be in [0, max_tokens = " + std::to_string(req.max_tokens) + "], got " +
                              std::to_string(req.min_tokens));
    }
    if (!(req.repetition_penalty > 0.0f)) return invalid_argument("repetition_penalty must be greater than 0");
    if (req.logprobs > 20) return invalid_argument("logprobs: at most 20 alternatives, got " + std::to_string(req.logprobs));
    for (int32_t id : req.stop_token_ids) {
      if (id < 0 || id >= model_->config.vocab_size) {
        return invalid_argument("stop_token_ids: " + std::to_string(id) + " is outside the vocabulary");
      }
    }
    for (const auto& [id, bias] : req.logit_bias) {
      if (id < 0 || id >= model_->config.vocab_size) {
        return invalid_argument("logit_bias: token " + std::to_string(id) + " is outside the vocabulary");
      }
    }
    SNAP_RETURN_IF_ERROR(req.kv_policy.validate());
    if (req.kv_policy.context_tokens > n) return invalid_argument("kv context_tokens is longer than the prompt");
    const bool layerwise_auto = choose_layerwise(req);
    if (layerwise_auto) req.kv_policy.layerwise = true;
    const int64_t need = peak_blocks(req);
    if (need > pool_->num_blocks()) {
      return invalid_argument("request needs " + std::to_string(need) + " KV blocks at its peak but the pool has " +
                              std::to_string(pool_->num_blocks()) +
                              " (shorten it, raise --kv-cache-mib, or use a compressing kv policy with layerwise)");
    }
    if (failed_.load()) return unavailable(failure_message());
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      if (metrics_) metrics_->add_request_rejected("shutting_down");
      return unavailable("server is shutting down");
    }
    // Waiting means not running: a request that a free sequence slot will take at once
    // never counts against max_waiting, so an idle engine takes max_num_seqs + max_waiting
    // requests at once and refuses the next.
    const int64_t queued = static_cast<int64_t>(incoming_.size()) + waiting_count_;
    const int64_t free_slots = std::max<int64_t>(0, cfg_.max_num_seqs - static_cast<int64_t>(running_.size()));
    if (queued + 1 > free_slots + cfg_.max_waiting) {
      if (metrics_) metrics_->add_request_rejected("queue_full");
      return resource_exhausted("too many requests waiting (" + std::to_string(cfg_.max_waiting) + "); retry later");
    }
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id_++;
    seq->group = seq->id;
    auto gate = std::make_shared<SinkGate>(std::move(sink), req.n);
    seq->req = std::move(req);
    seq->layerwise_auto = layerwise_auto;
    seq->arrival = now_seconds();
    const uint64_t id = seq->id;
    seq->sink = [this, gate, id](const EngineEvent& ev) {
      if (gate->deliver(ev)) forget_gate(id);
    };
    {
      std::lock_guard<std::mutex> gates_lock(gates_mu_);
      gates_[id] = gate;
    }
    incoming_.push_back(std::move(seq));
    cv_.notify_one();
    return id;
  }

  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
    cv_.notify_one();
  }

  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ModelConfig& model_config() const override { return model_->config; }
  const std::string& model_name() const override { return name_; }
  bool healthy() const override {
    return alive_.load() && !failed_.load() && now_seconds() - heartbeat_.load() < 30.0;  // a step never stalls 30 s
  }
  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats st = stats_;
    // Blocks live from the pool: a sequence's blocks are freed before its finished event.
    st.kv_blocks_used = pool_->num_used();
    st.kv_blocks_total = pool_->num_blocks();
    return st;
  }

  void shutdown(double deadline_seconds) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!thread_.joinable()) {
        shutdown_workers();
        return;
      }
      stopping_ = true;
      stop_deadline_ = now_seconds() + std::max(0.0, deadline_seconds);
      cv_.notify_one();
    }
    thread_.join();
    shutdown_workers();
  }

 private:
  // --- group faults ---------------------------------------------------------------------

  // Every plan goes through here: under the watchdog's deadline when there is a group, and
  // refused once the group failed (no rank would answer).
  Status run_plan(const StepPlan& plan, std::span<float* const> logits = {}, std::vector<RankReport>* reports = nullptr) {
    if (failed_.load()) return unavailable(failure_message());
    if (!watchdog_) return driver_->run(plan, logits, reports);
    int64_t tokens = 0;
    for (const StepItem& it : plan.items) tokens += static_cast<int64_t>(it.tokens.size());
    watchdog_->arm(tokens);
    Status st = driver_->run(plan, logits, reports);
    watchdog_->disarm();
    // Communication errors (a peer closed its connection, MPI failed) are internal errors:
    // the group cannot go on. Plan errors (pool exhaustion, a bad request) happen alike on
    // every rank and leave the group usable.
    if (st.code() == StatusCode::k_internal) fail_group(st.message());
    if (failed_.load()) return unavailable(failure_message());
    return st;
  }

  std::string failure_message() const {
    std::lock_guard<std::mutex> lock(failure_mu_);
    return "tensor-parallel group failed: " + failure_;
  }

  // Idempotent, any thread, never takes mu_ (the scheduler thread may hold it, stuck in a
  // collective): ends every open request with an error, then tells the owner.
  void fail_group(const std::string& why) {
    if (failed_.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(failure_mu_);
      failure_ = why;
    }
    std::fprintf(stderr, "snapserve: error: tensor-parallel group failed: %s\n", why.c_str());
    std::fflush(stderr);
    // The owner first: `batch` exits here, before any line could be recorded as an error
    // (a requeued job then runs those lines again); `serve` schedules its exit and lets
    // the error events below reach the clients.
    if (cfg_.on_group_failure) cfg_.on_group_failure(why);
    const Status st = unavailable(failure_message());
    std::vector<std::shared_ptr<SinkGate>> gates;
    {
      std::lock_guard<std::mutex> lock(gates_mu_);
      for (auto& [id, g] : gates_) gates.push_back(g);
      gates_.clear();
    }
    for (auto& g : gates) g->fail(st);
    cv_.notify_one();
  }

  void forget_gate(uint64_t id) {
    std::lock_guard<std::mutex> lock(gates_mu_);
    gates_.erase(id);
  }

  // Ends the other ranks' worker loops (after the scheduler thread is gone).
  void shutdown_workers() {
    watchdog_.reset();  // the workers are about to exit on purpose
    if (driver_ && !failed_.load()) {
      Status st = driver_->shutdown();
      if (!st.ok()) std::fprintf(stderr, "snapserve: error: stopping the worker ranks: %s\n", st.message().c_str());
    }
  }

  // --- reservations ---------------------------------------------------------------------

  // The automatic choice (EngineConfig::auto_layerwise): a compressing policy over the whole
  // prompt, no prompt logprobs, and layer-wise's peak below chunked's by generate's rule
  // (prefill_choice.h), with the largest layer budget bounded as after_compression_blocks does.
  bool choose_layerwise(const EngineRequest& req) const {
    if (!cfg_.auto_layerwise || req.kv_policy.layerwise || req.kv_policy.kind == KvPolicyKind::full ||
        req.kv_policy.context_tokens > 0 || req.prompt_logprobs >= 0) {
      return false;
    }
    PrefillPeakInputs in;
    in.prompt_tokens = static_cast<int64_t>(req.prompt_ids.size());
    in.num_layers = model_->config.num_layers;
    in.kv_heads = model_->shard.num_kv_heads;  // this rank's
    in.block_size = cfg_.kv_block_size;
    in.block_bytes = pool_->block_bytes();
    in.max_layer_budget =
        req.kv_policy.kind == KvPolicyKind::pyramidkv ? 2 * req.kv_policy.budget : req.kv_policy.budget;
    if (model_->config.sliding_window_pattern > 0) {  // gemma3's local layers keep their window
      in.max_layer_budget = std::max<int64_t>(in.max_layer_budget, model_->config.sliding_window);
    }
    in.prefill_chunk = cfg_.prefill_chunk;
    in.hidden_size = model_->config.hidden_size;
    return layerwise_prefill_is_cheaper(in);
  }

  // The prefill a sequence runs (step() takes the layer-wise path under the same conditions).
  static bool runs_layerwise(const Sequence& s) {
    return s.req.kv_policy.layerwise && s.req.kv_policy.kind != KvPolicyKind::full &&
           s.req.kv_policy.context_tokens == 0;
  }

  // Blocks the request holds at its peak: the uncompressed prompt (all layers) during
  // prefill — one layer of it with layer-wise prefill — or its compressed size + max_tokens.
  int64_t peak_blocks(const EngineRequest& req) const {
    const ModelConfig& c = model_->config;
    const int64_t bs = cfg_.kv_block_size;
    const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
    const int64_t kv_heads = model_->shard.num_kv_heads;  // this rank's
    const int64_t heads = int64_t{c.num_layers} * kv_heads;
    const int64_t full = heads * ceil_div(n + req.max_tokens, bs);
    // n choices: one prefill, then n copies of the (compressed) cache, each growing alone.
    if (req.kv_policy.kind == KvPolicyKind::full) return req.n * full;
    const int64_t prefill_peak = req.kv_policy.layerwise
                                     ? kv_heads * ceil_div(n, bs) + heads * ceil_div(req.kv_policy.budget * 2, bs)
                                     : heads * ceil_div(n, bs);
    return std::max(prefill_peak, req.n * after_compression_blocks(req, nullptr));
  }

  int64_t after_compression_blocks(const EngineRequest& req, const KvCompressor* comp) const {
    const ModelConfig& c = model_->config;
    const int64_t kv_heads = model_->shard.num_kv_heads;  // this rank's
    const int64_t bs = cfg_.kv_block_size;
    const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
    const int64_t compress_at = req.kv_policy.context_tokens > 0 ? req.kv_policy.context_tokens : n;
    int64_t blocks = 0;
    for (int l = 0; l < c.num_layers; ++l) {
      // pyramidkv layer budgets vary (up to ~2x the average): bound by twice the budget. A
      // windowed layer (gemma3's local layers) keeps its window instead, as the compressor does.
      const bool windowed = c.sliding_window_pattern > 0 && c.layer_window(l) > 0;
      const int64_t budget = comp       ? comp->layer_budget(l)
                             : windowed ? int64_t{c.layer_window(l)}
                             : (req.kv_policy.kind == KvPolicyKind::pyramidkv ? 2 * req.kv_policy.budget
                                                                                : req.kv_policy.budget);
      const int64_t kept = std::min(compress_at, budget) + (n - compress_at) + req.max_tokens;
      // adakv heads differ in size: each head may use one partly filled block more.
      const int64_t per_head = ceil_div(kept, bs) + (req.kv_policy.kind == KvPolicyKind::adakv ? 1 : 0);
      blocks += kv_heads * per_head;
    }
    if (req.kv_policy.kind == KvPolicyKind::adakv) {
      // adakv moves slots between heads: one head may hold up to all of its layer's slots.
      blocks = std::max(blocks, int64_t{c.num_layers} * ceil_div(kv_heads * (std::min(compress_at, req.kv_policy.budget) + req.max_tokens + n - compress_at), bs) + int64_t{c.num_layers} * kv_heads);
    }
    return blocks;
  }

  // --- the scheduler loop -----------------------------------------------------------------

  void loop() {
    // OpenMP's thread count is per thread: set it on the thread that runs the model.
    if (cfg_.threads > 0) omp_set_num_threads(cfg_.threads);
    while (true) {
      bool exit_loop = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, idle_wait(cfg_.comm), [&] {
          return stopping_ || !incoming_.empty() || !cancels_.empty() || !running_.empty() || !waiting_.empty();
        });
        for (auto& s : incoming_) waiting_.push_back(std::move(s));
        incoming_.clear();
        for (uint64_t id : cancels_) cancel_now(id);
        cancels_.clear();
        waiting_count_ = static_cast<int64_t>(waiting_.size());
        if (stopping_) {
          // Nothing new starts; running ones may finish until the deadline.
          while (!waiting_.empty()) {
            finish(*waiting_.front(), "abort");
            waiting_.pop_front();
          }
          if (running_.empty() || now_seconds() >= stop_deadline_) {
            for (auto& s : running_) finish(*s, "abort");
            running_.clear();
            exit_loop = true;
          }
        }
      }
      if (exit_loop) {
        publish_stats();
        break;
      }
      heartbeat_ = now_seconds();
      try {
        expire_timeouts();
        admit();
        if (!running_.empty()) step();
      } catch (const std::bad_alloc&) {
        out_of_memory();
      }
      publish_stats();
    }
    alive_ = false;
  }

  // A step ran out of memory (std::bad_alloc): every running request ends with an error naming
  // it, its blocks go back, and the next step serves the waiting ones. Which sequences the
  // forward had already extended is unknown, so none goes on. In a tensor-parallel group the
  // other ranks may have run a plan this rank did not finish: the group fails.
  void out_of_memory() {
    const std::string why =
        "out of memory: an allocation failed during a step" + memory_left_phrase() +
        "; the running requests were ended (shorter prompts, fewer prompt logprobs, a smaller --max-num-seqs or more "
        "memory would help)";
    std::fprintf(stderr, "snapserve: error: %s\n", why.c_str());
    if (watchdog_) {
      fail_group(why);
      return;
    }
    for (auto& s : running_)
      if (s->done_reason.empty()) fail(*s, internal_error(why));
    reap();
  }

  // Caller holds mu_.
  void cancel_now(uint64_t id) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->id == id) {
        finish(**it, "abort");
        waiting_.erase(it);
        return;
      }
    }
    for (auto it = running_.begin(); it != running_.end();) {  // every choice of the request
      if ((*it)->group == id) {
        finish(**it, "abort");
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void expire_timeouts() {
    const double now = now_seconds();
    auto expired = [&](const std::unique_ptr<Sequence>& s) {
      return s->req.timeout_seconds > 0 && now - s->arrival > s->req.timeout_seconds;
    };
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* list : {&waiting_, &running_}) {
      for (auto it = list->begin(); it != list->end();) {
        if (expired(*it)) {
          finish(**it, "timeout");
          it = list->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  void admit() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs) {
      Sequence& s = *waiting_.front();
      // Its n choices all need a slot (n <= max_num_seqs, checked at submit).
      if (static_cast<int64_t>(running_.size()) + s.req.n > cfg_.max_num_seqs) break;
      const int64_t need = peak_blocks(s.req);
      if (reserved_blocks_ + need > pool_->num_blocks()) break;  // FIFO: wait for room
      s.reserved_blocks = need;
      reserved_blocks_ += need;
      s.admitted = now_seconds();
      s.compress_at = s.req.kv_policy.context_tokens > 0 ? s.req.kv_policy.context_tokens : s.prompt_len();
      s.decoder = std::make_unique<StreamDecoder>(*tokenizer_, true);
      s.rng = kernels::Rng(s.req.sampling.seed);
      s.logits.resize(model_->config.vocab_size);
      if (s.req.repetition_penalty != 1.0f) {
        s.history.prompt_unique = s.req.prompt_ids;
        std::sort(s.history.prompt_unique.begin(), s.history.prompt_unique.end());
        s.history.prompt_unique.erase(std::unique(s.history.prompt_unique.begin(), s.history.prompt_unique.end()),
                                      s.history.prompt_unique.end());
      }
      if (metrics_) metrics_->observe_request_queue_time(s.admitted - s.arrival);
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
    waiting_count_ = static_cast<int64_t>(waiting_.size());
  }

  // One StepPlan: the sequences admitted since the last step are opened, then one forward
  // runs a prompt chunk (first, for batch invariance: see LlamaForward::forward_batch) and
  // one decode token per decoding sequence. A layer-wise prefill runs a whole prompt
  // through one layer at a time, alone in its step.
  void step() {
    const double t0 = now_seconds();
    StepPlan plan;
    for (auto& s : running_) {
      if (s->open) continue;
      plan.open.push_back({s->id, s->req.kv_policy, s->compress_at});
      s->open = true;
    }
    std::vector<Sequence*> seqs;
    std::vector<int64_t> lens;
    std::vector<float*> outs;
    bool has_prefill = false;
    bool solo = false;  // a prompt chunk that wants every position's logits runs alone
    for (auto& s : running_) {
      if (s->prefilled == 0 && s->req.kv_policy.layerwise && s->req.kv_policy.kind != KvPolicyKind::full &&
          s->req.kv_policy.context_tokens == 0 && s->compress_at > 0) {
        plan.chunk = cfg_.prefill_chunk;
        plan.items.push_back({s->id, 0, s->req.prompt_ids, true, true, LogitsWanted::last});
        seqs.push_back(s.get());
        lens.push_back(s->prompt_len());
        outs.push_back(s->logits.data());
        has_prefill = true;
        break;
      }
    }
    if (plan.items.empty()) {
      for (auto& s : running_) {
        if (!s->prefilling()) continue;
        int64_t len = std::min(cfg_.prefill_chunk, s->prompt_len() - s->prefilled);
        if (s->req.kv_policy.kind != KvPolicyKind::full && s->prefilled < s->compress_at) {
          len = std::min(len, s->compress_at - s->prefilled);  // a chunk never crosses the compression point
        }
        const bool last = s->prefilled + len == s->prompt_len();
        const bool scored = s->req.prompt_logprobs >= 0;  // every position's logits: a step of its own
        StepItem item{s->id, static_cast<int32_t>(s->prefilled), {}, true, false,
                      scored ? LogitsWanted::all : last ? LogitsWanted::last : LogitsWanted::none};
        item.tokens.assign(s->req.prompt_ids.begin() + s->prefilled, s->req.prompt_ids.begin() + s->prefilled + len);
        plan.items.push_back(std::move(item));
        seqs.push_back(s.get());
        lens.push_back(len);
        if (scored) s->chunk_logits.resize(static_cast<size_t>(len * model_->config.vocab_size));
        outs.push_back(scored ? s->chunk_logits.data() : last ? s->logits.data() : nullptr);
        has_prefill = true;
        solo = scored;
        break;  // one prompt chunk per step keeps the running streams' latency bounded
      }
      for (auto& s : running_) {
        if (solo) break;
        if (s->prefilling()) continue;
        const int32_t pos = static_cast<int32_t>(s->prompt_len() + s->generated - 1);
        plan.items.push_back({s->id, pos, {s->next_token}, false, false, LogitsWanted::last});
        seqs.push_back(s.get());
        lens.push_back(1);
        outs.push_back(s->logits.data());
      }
    }
    if (plan.items.empty() && plan.open.empty()) return;
    const Status st = run_plan(plan, plan.items.empty() ? std::span<float* const>{} : std::span<float* const>(outs));
    // Fault injection for tests: $SNAP_FAULT_BAD_ALLOC_STEP=N makes the N-th step's allocation after
    // its forward fail (the forward has extended its sequences' KV, the hard case).
    if (fault_bad_alloc_step_ > 0 && ++steps_run_ == fault_bad_alloc_step_) throw std::bad_alloc();
    const double dt = now_seconds() - t0;
    if (plan.items.empty()) {
      if (!st.ok()) {
        for (auto& s : running_) fail(*s, st);
        reap();
      }
      return;
    }
    if (metrics_) metrics_->observe_step_latency(has_prefill ? "prefill" : "decode", 0, dt);
    peak_step_sequences_ = std::max<int64_t>(peak_step_sequences_, static_cast<int64_t>(seqs.size()));
    std::vector<TokenStream*> rows;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = *seqs[i];
      if (s.prefilling()) {
        if (st.ok() && s.req.prompt_logprobs >= 0) score_prompt_chunk(s, s.prefilled, lens[i]);
        s.prefilled += lens[i];
        s.prefill_seconds += dt;
        after_prefill_chunk(s, st, t0);
      } else if (!st.ok()) {
        fail(s, st);
      } else {
        rows.push_back(&s);
      }
    }
    // The decode rows' draws on OpenMP threads (each row its own generator), then their events.
    sample_and_emit_rows(rows, emit_context());
    reap();
  }

  void score_prompt_chunk(Sequence& s, int64_t start, int64_t len) {
    snap::score_prompt_chunk(s, s.chunk_logits.data(), start, len, model_->config.vocab_size);
  }

  void after_prefill_chunk(Sequence& s, const Status& st, double t0) {
    if (!st.ok()) {
      fail(s, st);
      return;
    }
    const Worker::Sequence* ws = worker_->sequence(s.id);
    if (ws && ws->compressor->active() && !s.compressed && ws->compressor->layer_done(0)) {
      s.compressed = true;
      const int64_t after = s.req.n * after_compression_blocks(s.req, ws->compressor.get());
      std::lock_guard<std::mutex> lock(mu_);
      if (after < s.reserved_blocks) {
        reserved_blocks_ -= s.reserved_blocks - after;
        s.reserved_blocks = after;
      }
      if (metrics_) metrics_->observe_snapkv_selection(ws->compressor->selection_seconds());
    }
    if (!s.prefilling()) {
      if (s.prefill_seconds == 0) s.prefill_seconds = now_seconds() - t0;
      if (metrics_) metrics_->observe_request_prefill_time(s.prefill_seconds);
      if (s.req.max_tokens == 0) {  // scoring only (echo): nothing to generate
        s.done_reason = "length";
        return;
      }
      std::vector<std::unique_ptr<Sequence>> choices;
      if (s.req.n > 1) {
        Status forked = fork_choices(s, &choices);
        if (!forked.ok()) return fail(s, forked);
      }
      sample_and_emit(s);
      for (auto& c : choices) sample_and_emit(*c);
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : choices) running_.push_back(std::move(c));
    }
  }

  // Copies s's prefilled (and compressed) KV into n - 1 new sequences on every rank and
  // splits its reservation among them: each choice holds its own copy, 1/n of the total.
  Status fork_choices(Sequence& s, std::vector<std::unique_ptr<Sequence>>* out) {
    StepPlan plan;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int c = 1; c < s.req.n; ++c) {
        auto k = std::make_unique<Sequence>();
        k->id = next_id_++;
        start_choice(s, c, *tokenizer_, k.get());
        k->layerwise_auto = s.layerwise_auto;
        k->compress_at = s.compress_at;
        k->compressed = s.compressed;
        plan.forks.push_back({s.id, k->id});
        out->push_back(std::move(k));
      }
    }
    if (Status st = run_plan(plan); !st.ok()) {
      StepPlan undo;  // the copies made before the failure
      for (const SequenceFork& f : plan.forks) undo.close.push_back(f.dst);
      (void)run_plan(undo);
      out->clear();
      return st;
    }
    std::lock_guard<std::mutex> lock(mu_);
    s.forked = true;
    const int64_t share = s.reserved_blocks / s.req.n;
    for (auto& k : *out) {
      k->open = true;
      k->reserved_blocks = share;
      s.reserved_blocks -= share;
    }
    return Status::ok_status();
  }

  void fail(Sequence& s, const Status& st) {
    s.done_reason = "error";
    s.error = st;
  }

  // Samples the next token from s.logits and streams it; marks the sequence done when a
  // stop condition holds (coordinator/scheduler/token_stream.h).
  void sample_and_emit(Sequence& s) { snap::sample_and_emit(s, emit_context()); }
  EmitContext emit_context() const {
    EmitContext c;
    c.vocab = model_->config.vocab_size;
    c.context = context_;
    c.eos = &eos_;
    c.metrics = metrics_;
    return c;
  }

  // Finishes and removes every sequence marked done.
  void reap() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = running_.begin(); it != running_.end();) {
      if (!(*it)->done_reason.empty()) {
        finish(**it, (*it)->done_reason);
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Sends the final event and releases the sequence's blocks and reservation. Caller holds mu_.
  void finish(Sequence& s, const std::string& reason) {
    EngineEvent ev;
    ev.index = s.choice;
    finish_stream(s, reason, &ev);
    if (!s.child()) ev.prompt_logprobs = std::move(s.prompt_logprobs);
    if (s.open) {
      if (const Worker::Sequence* ws = worker_->sequence(s.id)) {
        ev.kv_resident_bytes = ws->cache->resident_bytes();
        ev.kv_full_equivalent_bytes = ws->cache->full_equivalent_bytes();
      }
      ev.prefill_kind = prefill_kind_name(runs_layerwise(s), s.layerwise_auto);
      StepPlan close;  // blocks back to every rank's pool before the event goes out
      close.close.push_back(s.id);
      Status st = run_plan(close);
      if (!st.ok() && !failed_.load()) std::fprintf(stderr, "snapserve: error: closing sequence %llu: %s\n",
                                 static_cast<unsigned long long>(s.id), st.message().c_str());
      s.open = false;
    }
    reserved_blocks_ -= s.reserved_blocks;
    s.reserved_blocks = 0;
    if (metrics_) {
      const double now = now_seconds();
      metrics_->add_generation_tokens(s.generated);
      if (!s.child()) {  // per request, not per choice
        metrics_->add_prompt_tokens(s.prefilled);
        metrics_->add_request_success(reason);
        metrics_->observe_e2e_request_latency(now - s.arrival);
      }
      if (s.generated > 1) metrics_->observe_time_per_output_token((s.last_token - s.first_token) / (s.generated - 1));
      if (ev.kv_resident_bytes > 0 && s.compressed) {
        metrics_->observe_kv_compression_ratio(kv_policy_name(s.req.kv_policy.kind),
                                               static_cast<double>(ev.kv_full_equivalent_bytes) / ev.kv_resident_bytes);
      }
    }
    s.sink(ev);
    // Choice 0 ending before its prompt forked (cancelled, timed out or failed during
    // prefill): the other choices never started, and end with it.
    end_unforked_choices(s, ev);
  }

  void publish_stats() {
    // Every rank's memory and traffic, gathered about once a second (one all_gather). With a
    // group also without metrics (batch): it is the idle leader's heartbeat, since the other
    // ranks give up on a rank 0 silent for --collective-timeout (worker_loop); so it comes at
    // least every quarter of that (report_interval_seconds).
    std::vector<RankReport> reports;
    const double now = now_seconds();
    const bool grouped = cfg_.comm != nullptr && cfg_.comm->group_size() > 1;
    if ((metrics_ || grouped) && now - last_report_ >= report_interval_seconds(cfg_.comm)) {
      last_report_ = now;
      StepPlan ask;
      ask.report = true;
      Status st = run_plan(ask, {}, &reports);
      if (!st.ok() && !failed_.load()) std::fprintf(stderr, "snapserve: error: rank reports: %s\n", st.message().c_str());
      // A worker rank got a stop signal: the whole group drains (once).
      for (const RankReport& r : reports) {
        if (r.drain_requested && !drain_requested_) {
          drain_requested_ = true;
          if (cfg_.on_drain_request) cfg_.on_drain_request();
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.waiting = static_cast<int64_t>(waiting_.size() + incoming_.size());
    stats_.kv_blocks_used = pool_->num_used();
    stats_.kv_blocks_total = pool_->num_blocks();
    stats_.peak_step_sequences = peak_step_sequences_;
    stats_.peak_kv_blocks_used = pool_->peak_used();
    if (!metrics_) return;
    metrics_->set_num_requests_running(stats_.running);
    metrics_->set_num_requests_waiting(stats_.waiting);
    metrics_->set_kv_cache_usage_ratio(static_cast<double>(stats_.kv_blocks_used) / std::max<int64_t>(1, stats_.kv_blocks_total));
    // This rank's memory every iteration; the group's with each report.
    metrics_->set_kv_cache_resident_bytes(0, pool_->resident_bytes());
    metrics_->set_kv_cache_full_equivalent_bytes(0, pool_->full_equivalent_bytes());
    metrics_->set_process_resident_memory_bytes(0, current_rss_bytes());
    const double unix_now = static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count()) / 1e3;
    reported_.resize(std::max(reported_.size(), reports.size()));
    for (size_t r = 0; r < reports.size(); ++r) {
      const RankReport& rep = reports[r];
      const int rank = static_cast<int>(r);
      metrics_->set_kv_cache_resident_bytes(rank, rep.kv_resident_bytes);
      metrics_->set_kv_cache_full_equivalent_bytes(rank, rep.kv_full_equivalent_bytes);
      metrics_->set_process_resident_memory_bytes(rank, rep.rss_bytes);
      metrics_->set_rank_last_report_time(rank, unix_now);
      RankReport& last = reported_[r];  // counters: add what is new since the last report
      metrics_->add_comm_bytes(rank, "all_reduce", rep.all_reduce_bytes - last.all_reduce_bytes);
      metrics_->add_comm_bytes(rank, "broadcast", rep.broadcast_bytes - last.broadcast_bytes);
      metrics_->add_comm_bytes(rank, "all_gather", rep.all_gather_bytes - last.all_gather_bytes);
      metrics_->add_comm_seconds(rank, "all_reduce", rep.all_reduce_seconds - last.all_reduce_seconds);
      metrics_->add_comm_seconds(rank, "broadcast", rep.broadcast_seconds - last.broadcast_seconds);
      metrics_->add_comm_seconds(rank, "all_gather", rep.all_gather_seconds - last.all_gather_seconds);
      metrics_->add_busy_seconds(rank, rep.busy_seconds - last.busy_seconds);
      last = rep;
    }
  }

  EngineConfig cfg_;
  ServerMetrics* metrics_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<LlamaForward> forward_;
  std::unique_ptr<Worker> worker_;       // this rank: the pool and every sequence's KV
  std::unique_ptr<StepDriver> driver_;   // runs plans here and on the other ranks
  const BlockPool* pool_ = nullptr;      // worker_'s, read for admission and stats
  double last_report_ = -1e9;
  std::vector<RankReport> reported_;     // last report per rank (counter deltas)
  std::string name_;
  std::vector<int32_t> eos_;
  int64_t context_ = 0, max_prompt_ = 0, max_tokens_limit_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> incoming_;  // submitted, not yet seen by the loop
  std::deque<std::unique_ptr<Sequence>> waiting_;   // seen, not admitted (FIFO)
  std::deque<std::unique_ptr<Sequence>> running_;   // admitted: prefilling or decoding
  std::vector<uint64_t> cancels_;
  int64_t waiting_count_ = 0;
  int64_t reserved_blocks_ = 0;
  int64_t peak_step_sequences_ = 0;  // engine thread only; copied into stats_ under mu_
  int64_t steps_run_ = 0;            // engine thread only: steps that ran a plan (for the fault below)
  const int64_t fault_bad_alloc_step_ = fault_bad_alloc_step();
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  double stop_deadline_ = 0;
  EngineStats stats_;
  std::atomic<bool> alive_{false};
  std::atomic<double> heartbeat_{0};
  bool drain_requested_ = false;  // engine thread only

  // Group faults: gates_ holds every request not yet finished (its SinkGate), by id.
  std::mutex gates_mu_;
  std::map<uint64_t, std::shared_ptr<SinkGate>> gates_;
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  std::string failure_;
  std::unique_ptr<GroupWatchdog> watchdog_;  // with a group only; stopped before the rest
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& cfg, ServerMetrics* metrics) {
  auto engine = std::make_unique<EngineImpl>(cfg, metrics);
  SNAP_RETURN_IF_ERROR(engine->init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace snap
