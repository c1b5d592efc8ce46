// Worker::run (open → forward → compress → dump → close), StepDriver and worker_loop.
#include "worker/worker.h"

#include <nlohmann/json.hpp>

#include "common/sys.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

namespace snap {

Worker::Worker(LlamaForward& forward) : forward_(forward) {}

const Worker::Sequence* Worker::sequence(uint64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

Status Worker::run(const StepPlan& plan, std::span<float* const> logits) {
  if (plan.shutdown) return {};
  const double t0 = now_seconds();
  const Status st = run_plan(plan, logits);
  busy_seconds_ += now_seconds() - t0;
  return st;
}

Status Worker::run_plan(const StepPlan& plan, std::span<float* const> logits) {
  if (plan.pool_bytes > 0) {
    if (!seqs_.empty()) {
      return internal_error("step plan resizes the KV pool while " + std::to_string(seqs_.size()) +
                                 " sequences are open");
    }
    BlockPoolConfig pc;
    pc.block_size = plan.block_size;
    pc.kv_dtype = plan.kv_dtype;
    pc.head_dim = config().head_dim;
    pc.capacity_bytes = plan.pool_bytes;
    pool_.reset();
    SNAP_ASSIGN_OR_RETURN(pool_, BlockPool::create(pc));
  }
  for (const SequenceOpen& o : plan.open) {
    if (!pool_) return internal_error("step plan opens a sequence before sizing the KV pool");
    if (seqs_.count(o.seq)) return invalid_argument("step plan opens sequence " + std::to_string(o.seq) + " twice");
    SNAP_RETURN_IF_ERROR(o.policy.validate());
    Sequence s;
    s.cache = std::make_unique<PagedKvCache>(*pool_, forward_.kv_shape());
    s.compressor = std::make_unique<KvCompressor>(o.policy, forward_.compressor_shape(), o.compress_at);
    seqs_.emplace(o.seq, std::move(s));
  }
  for (const SequenceFork& f : plan.forks) {
    auto src = seqs_.find(f.src);
    if (src == seqs_.end()) return invalid_argument("step plan forks sequence " + std::to_string(f.src) + ", which is not open");
    if (seqs_.count(f.dst)) return invalid_argument("step plan forks into sequence " + std::to_string(f.dst) + ", already open");
    Sequence s;
    s.cache = std::make_unique<PagedKvCache>(*pool_, forward_.kv_shape());
    SNAP_RETURN_IF_ERROR(s.cache->copy_from(*src->second.cache));
    // Past its compression point already: the copy's compressor never observes or compresses.
    s.compressor = std::make_unique<KvCompressor>(src->second.compressor->policy(), forward_.compressor_shape(),
                                                  src->second.compressor->compress_at());
    seqs_.emplace(f.dst, std::move(s));
  }
  if (!plan.items.empty()) SNAP_RETURN_IF_ERROR(run_items(plan, logits));
  for (const SelectionDump& d : plan.dumps) SNAP_RETURN_IF_ERROR(write_selection(d));
  for (uint64_t seq : plan.close) seqs_.erase(seq);
  return {};
}

Status Worker::run_items(const StepPlan& plan, std::span<float* const> logits) {
  if (!logits.empty() && logits.size() != plan.items.size()) {
    return invalid_argument("step plan has " + std::to_string(plan.items.size()) + " items but " +
                            std::to_string(logits.size()) + " logits buffers");
  }
  std::vector<Sequence*> seqs;
  for (const StepItem& it : plan.items) {
    auto found = seqs_.find(it.seq);
    if (found == seqs_.end()) return invalid_argument("step plan runs sequence " + std::to_string(it.seq) + ", which is not open");
    Sequence& s = found->second;
    if (it.tokens.empty()) return invalid_argument("step plan item of sequence " + std::to_string(it.seq) + " has no tokens");
    if (s.cache->next_position() != it.start_position) {
      return internal_error("rank " + std::to_string(shard().tp_rank) + ": sequence " + std::to_string(it.seq) +
                            " is at position " + std::to_string(s.cache->next_position()) + ", the plan says " +
                            std::to_string(it.start_position));
    }
    for (int32_t id : it.tokens) {
      if (id < 0 || id >= config().vocab_size) return invalid_argument("step plan token id " + std::to_string(id) + " out of range");
    }
    seqs.push_back(&s);
  }
  // Every rank computes its share of the logits the plan asks for (the LM head is
  // vocab-parallel); only rank 0 receives them. A rank given no buffer passes a dummy
  // non-null pointer, which LlamaForward reads as "wanted" and never writes off rank 0.
  float dummy = 0;
  std::vector<std::vector<float>> unclaimed(plan.items.size());  // rank 0 asked for no buffer
  auto out = [&](size_t i) -> float* {
    const StepItem& it = plan.items[i];
    if (it.logits == LogitsWanted::none) return nullptr;
    if (!forward_.is_logits_rank()) return &dummy;
    if (!logits.empty() && logits[i] != nullptr) return logits[i];
    const size_t rows = it.logits == LogitsWanted::all ? it.tokens.size() : 1;
    unclaimed[i].resize(rows * static_cast<size_t>(config().vocab_size));
    return unclaimed[i].data();
  };
  // The compressor sees a prompt chunk only while the cache is below its compression point.
  auto observing = [](const Sequence& s) {
    KvCompressor* c = s.compressor.get();
    return c->active() && s.cache->next_position() < c->compress_at() ? c : nullptr;
  };
  const StepItem& first = plan.items[0];
  if (first.layerwise) {
    if (plan.items.size() != 1) return invalid_argument("a layer-wise prefill must be alone in its step plan");
    KvCompressor& c = *seqs[0]->compressor;
    if (!c.active() || c.compress_at() != static_cast<int64_t>(first.tokens.size()) || first.start_position != 0) {
      return invalid_argument("layer-wise prefill needs a compressing policy over the whole prompt");
    }
    SNAP_RETURN_IF_ERROR(forward_.prefill_layerwise(first.tokens.data(), static_cast<int64_t>(first.tokens.size()),
                                                    *seqs[0]->cache, out(0), plan.chunk, c));
  } else if (first.logits == LogitsWanted::all) {
    // Every position's logits (--dump-logits): the single-sequence forward.
    if (plan.items.size() != 1) return invalid_argument("all-position logits need a step plan of one item");
    SNAP_RETURN_IF_ERROR(forward_.forward(first.tokens.data(), static_cast<int64_t>(first.tokens.size()),
                                          *seqs[0]->cache, out(0), true, first.prefill ? observing(*seqs[0]) : nullptr));
  } else {
    // The batched forward, also for one item: a sequence gets the same logits alone or
    // batched (LlamaForward::forward_batch).
    std::vector<LlamaForward::BatchItem> batch;
    for (size_t i = 0; i < plan.items.size(); ++i) {
      const StepItem& it = plan.items[i];
      if (it.layerwise) return invalid_argument("a layer-wise prefill must be alone in its step plan");
      if (it.logits == LogitsWanted::all) return invalid_argument("all-position logits need a step plan of one item");
      batch.push_back({seqs[i]->cache.get(), it.tokens.data(), static_cast<int64_t>(it.tokens.size()),
                       it.prefill ? observing(*seqs[i]) : nullptr, out(i), it.prefill});
    }
    SNAP_RETURN_IF_ERROR(forward_.forward_batch(batch));
  }
  // A sequence whose prompt just reached the compression point is compressed, every layer.
  for (Sequence* s : seqs) {
    KvCompressor& c = *s->compressor;
    if (!c.active() || s->cache->next_position() != c.compress_at()) continue;
    for (int l = 0; l < config().num_layers; ++l) SNAP_RETURN_IF_ERROR(c.compress_layer(l, *s->cache));
  }
  return {};
}

// Per layer and KV head of this rank, the positions the cache holds; with tp > 1 one file
// per rank (path.rank<r>) naming the global KV heads it covers.
Status Worker::write_selection(const SelectionDump& d) const {
  const Sequence* s = sequence(d.seq);
  if (!s) return invalid_argument("selection dump of sequence " + std::to_string(d.seq) + ", which is not open");
  const KvPolicy& p = s->compressor->policy();
  const TpShard& sh = shard();
  nlohmann::json doc;
  doc["policy"] = kv_policy_name(p.kind);
  doc["prompt_tokens"] = d.prompt_tokens;
  doc["compressed_tokens"] = s->compressor->compress_at();
  doc["budget"] = p.budget;
  doc["window"] = p.window;
  doc["kernel"] = p.kernel;
  doc["pooling"] = p.pooling == KvPooling::max ? "max" : "avg";
  doc["gqa"] = p.aggregation == GqaAggregation::mean ? "mean" : "max";
  doc["tp_rank"] = sh.tp_rank;
  doc["tp_size"] = sh.tp_size;
  doc["kv_head_begin"] = sh.kv_head_begin;
  doc["kv_replicas"] = sh.kv_replicas;
  doc["layers"] = nlohmann::json::array();
  for (int l = 0; l < config().num_layers; ++l) {
    nlohmann::json heads = nlohmann::json::array();
    for (int g = 0; g < sh.num_kv_heads; ++g) heads.push_back(s->cache->positions(l, g));
    doc["layers"].push_back({{"layer", l}, {"heads", heads}});
  }
  const std::string path = sh.tp_size > 1 ? d.path + ".rank" + std::to_string(sh.tp_rank) : d.path;
  std::ofstream f(path);
  f << doc.dump() << "\n";
  if (!f) return invalid_argument(path + ": cannot write the KV selection dump");
  return {};
}

RankReport Worker::report(const comm::Communicator* comm) const {
  RankReport r;
  if (pool_) {
    r.kv_resident_bytes = pool_->resident_bytes();
    r.kv_full_equivalent_bytes = pool_->full_equivalent_bytes();
  }
  r.rss_bytes = current_rss_bytes();
  if (comm) {
    const comm::CommStats st = comm->stats();
    r.all_reduce_bytes = st[comm::CommOp::all_reduce_sum].bytes;
    r.broadcast_bytes = st[comm::CommOp::broadcast].bytes;
    r.all_gather_bytes = st[comm::CommOp::all_gather].bytes;
    r.all_reduce_seconds = st[comm::CommOp::all_reduce_sum].seconds;
    r.broadcast_seconds = st[comm::CommOp::broadcast].seconds;
    r.all_gather_seconds = st[comm::CommOp::all_gather].seconds;
  }
  r.busy_seconds = busy_seconds_;
  r.pid = current_pid();
  r.host_id = host_id();
  r.drain_requested = drain_requested_.load() ? 1 : 0;
  return r;
}

// ---------------------------------------------------------------------------
// StepDriver and worker_loop: a plan travels as two broadcasts from group rank 0, its
// size (one i64) and its bytes.

StepDriver::StepDriver(Worker& local, comm::Communicator* comm) : local_(local), comm_(comm) {}

namespace {

bool has_group(const comm::Communicator* comm) { return comm != nullptr && comm->group_size() > 1; }

// RankReports travel as raw bits in an f32 all_gather (a copy, no arithmetic).
constexpr int64_t k_report_words = sizeof(RankReport) / sizeof(float);
static_assert(sizeof(RankReport) % sizeof(float) == 0);

Status gather_reports(comm::Communicator& comm, const RankReport& mine, std::vector<RankReport>* all) {
  std::vector<RankReport> recv(static_cast<size_t>(comm.group_size()));
  SNAP_RETURN_IF_ERROR(comm.all_gather(&mine, recv.data(), k_report_words, DType::f32));
  if (all) *all = std::move(recv);
  return {};
}

Status send_plan(comm::Communicator& comm, const StepPlan& plan) {
  std::vector<uint8_t> bytes = encode_step_plan(plan);
  return comm.broadcast_message(bytes, 0, "step plan");
}

}  // namespace

Status StepDriver::run(const StepPlan& plan, std::span<float* const> logits, std::vector<RankReport>* reports) {
  if (has_group(comm_)) SNAP_RETURN_IF_ERROR(send_plan(*comm_, plan));
  const Status st = local_.run(plan, logits);
  // An internal error means this rank's state no longer matches the plan (the others may
  // be fine): going on would desynchronise the group's collectives, so end the job.
  if (st.code() == StatusCode::k_internal && has_group(comm_)) {
    if (!on_internal_error_) comm_->abort_job("step failed: " + st.message());
    on_internal_error_(st);
  }
  if (plan.report) {
    // Always joined, also after an error: the other ranks are waiting in it.
    if (has_group(comm_)) {
      SNAP_RETURN_IF_ERROR(gather_reports(*comm_, local_.report(comm_), reports));
    } else if (reports) {
      *reports = {local_.report(comm_)};
    }
  }
  return st;
}

Status agree_on_load(comm::Communicator* comm, const Status& local) {
  if (!has_group(comm)) return local;
  float failed = local.ok() ? 0.0f : 1.0f;
  comm->arm_load_timeout();  // a rank still loading (or stuck loading) is waited for --load-timeout
  if (Status st = comm->all_reduce_sum(std::span<float>(&failed, 1)); !st.ok())
    return Status(st.code(), "the ranks did not all load their shards: " + st.message());
  if (!local.ok()) return Status(local.code(), "rank " + std::to_string(comm->world().rank()) + ": " + local.message());
  if (failed > 0) return internal_error(std::to_string(static_cast<int>(failed)) + " other rank(s) failed to load their shard (see their message)");
  comm->reset_stats();  // the counters start with the model's traffic
  comm->arm_collective_timeout();  // from here a rank that stops answering is a failure
  return {};
}

double report_interval_seconds(const comm::Communicator* comm) {
  const double timeout = comm ? std::chrono::duration<double>(comm->collective_timeout()).count() : 0.0;
  return timeout > 0 ? std::min(1.0, timeout / 4) : 1.0;
}

std::chrono::milliseconds idle_wait(const comm::Communicator* comm) {
  const auto half = static_cast<int64_t>(report_interval_seconds(comm) * 500);
  return std::chrono::milliseconds(std::clamp<int64_t>(half, 1, 200));
}

Status StepDriver::shutdown() {
  if (shut_down_) return {};
  shut_down_ = true;
  if (!has_group(comm_)) return {};
  StepPlan plan;
  plan.shutdown = true;
  return send_plan(*comm_, plan);
}

Status worker_loop(Worker& worker, comm::Communicator& comm) {
  std::vector<uint8_t> bytes;
  // Rank 0 sends a plan every step and, idle, a report at least once a second: bounded waits
  // (Communicator::BroadcastBound), --load-timeout for the first plan, then --collective-timeout.
  comm.bound_broadcasts();
  for (;;) {
    SNAP_RETURN_IF_ERROR(comm.broadcast_message(bytes, 0, "step plan"));
    SNAP_ASSIGN_OR_RETURN(StepPlan plan, decode_step_plan(bytes));
    if (plan.shutdown) return {};
    Status st = worker.run(plan);
    if (st.code() == StatusCode::k_internal) comm.abort_job("step failed: " + st.message());  // see StepDriver::run
    if (!st.ok()) std::fprintf(stderr, "snapserve: rank %d: step failed: %s\n", comm.world().rank(), st.message().c_str());
    if (plan.report) SNAP_RETURN_IF_ERROR(gather_reports(comm, worker.report(&comm), nullptr));
  }
}

}  // namespace snap
