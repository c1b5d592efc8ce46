// StepPlan encoding: little-endian fixed-width fields in declaration order, vectors and
// strings prefixed by a u64 count. A version byte leads so a mixed-binary job fails loudly.
#include "worker/step_plan.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace snap {
namespace {

constexpr uint8_t k_plan_version = 3;

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool get(T* v) {
    if (in_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  // A count of items of at least `item_bytes` each that the rest of the input can hold.
  bool get_count(uint64_t* n, size_t item_bytes) {
    return get(n) && *n <= (in_.size() - at_) / std::max<size_t>(item_bytes, 1);
  }
  bool get_string(std::string* s) {
    uint64_t n = 0;
    if (!get_count(&n, 1)) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return true;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t at_ = 0;
};

void put_policy(Writer& w, const KvPolicy& p) {
  w.put<uint8_t>(static_cast<uint8_t>(p.kind));
  w.put<int64_t>(p.budget);
  w.put<int32_t>(p.window);
  w.put<int32_t>(p.kernel);
  w.put<uint8_t>(static_cast<uint8_t>(p.pooling));
  w.put<uint8_t>(static_cast<uint8_t>(p.aggregation));
  w.put<int32_t>(p.num_sink);
  w.put<double>(p.adakv_alpha);
  w.put<int32_t>(p.pyramid_beta);
  w.put<int64_t>(p.context_tokens);
  w.put<uint8_t>(p.layerwise ? 1 : 0);
}

bool get_policy(Reader& r, KvPolicy* p) {
  uint8_t kind = 0, pooling = 0, aggregation = 0, layerwise = 0;
  int32_t window = 0, kernel = 0, sinks = 0, beta = 0;
  const bool ok = r.get(&kind) && r.get(&p->budget) && r.get(&window) && r.get(&kernel) && r.get(&pooling) &&
                  r.get(&aggregation) && r.get(&sinks) && r.get(&p->adakv_alpha) && r.get(&beta) &&
                  r.get(&p->context_tokens) && r.get(&layerwise);
  if (!ok || kind > static_cast<uint8_t>(KvPolicyKind::adakv) || pooling > 1 || aggregation > 1 || layerwise > 1) {
    return false;
  }
  p->kind = static_cast<KvPolicyKind>(kind);
  p->window = window;
  p->kernel = kernel;
  p->pooling = static_cast<KvPooling>(pooling);
  p->aggregation = static_cast<GqaAggregation>(aggregation);
  p->num_sink = sinks;
  p->pyramid_beta = beta;
  p->layerwise = layerwise != 0;
  return true;
}

}  // namespace

std::vector<uint8_t> encode_step_plan(const StepPlan& plan) {
  Writer w;
  w.put<uint8_t>(k_plan_version);
  w.put<uint8_t>(plan.shutdown ? 1 : 0);
  w.put<int64_t>(plan.pool_bytes);
  w.put<int32_t>(plan.block_size);
  w.put<uint8_t>(static_cast<uint8_t>(plan.kv_dtype));
  w.put<int64_t>(plan.chunk);
  w.put<uint64_t>(plan.open.size());
  for (const SequenceOpen& o : plan.open) {
    w.put<uint64_t>(o.seq);
    put_policy(w, o.policy);
    w.put<int64_t>(o.compress_at);
  }
  w.put<uint64_t>(plan.forks.size());
  for (const SequenceFork& f : plan.forks) {
    w.put<uint64_t>(f.src);
    w.put<uint64_t>(f.dst);
  }
  w.put<uint64_t>(plan.items.size());
  for (const StepItem& it : plan.items) {
    w.put<uint64_t>(it.seq);
    w.put<int32_t>(it.start_position);
    w.put<uint8_t>(static_cast<uint8_t>((it.prefill ? 1 : 0) | (it.layerwise ? 2 : 0)));
    w.put<uint8_t>(static_cast<uint8_t>(it.logits));
    w.put<uint64_t>(it.tokens.size());
    for (int32_t t : it.tokens) w.put<int32_t>(t);
  }
  w.put<uint64_t>(plan.dumps.size());
  for (const SelectionDump& d : plan.dumps) {
    w.put<uint64_t>(d.seq);
    w.put_string(d.path);
    w.put<int64_t>(d.prompt_tokens);
  }
  w.put<uint64_t>(plan.close.size());
  for (uint64_t s : plan.close) w.put<uint64_t>(s);
  w.put<uint8_t>(plan.report ? 1 : 0);
  return w.take();
}

Result<StepPlan> decode_step_plan(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  StepPlan plan;
  auto bad = [](const std::string& what) { return data_loss("malformed step plan: " + what); };
  uint8_t version = 0, shutdown = 0;
  if (!r.get(&version)) return bad("empty");
  if (version != k_plan_version) {
    return bad("version " + std::to_string(version) + ", this binary speaks " + std::to_string(k_plan_version) +
               " (are all ranks running the same snapserve?)");
  }
  uint8_t kv_dtype = 0;
  if (!r.get(&shutdown) || !r.get(&plan.pool_bytes) || !r.get(&plan.block_size) || !r.get(&kv_dtype) ||
      !r.get(&plan.chunk)) {
    return bad("truncated header");
  }
  if (kv_dtype != static_cast<uint8_t>(DType::f32) && kv_dtype != static_cast<uint8_t>(DType::bf16) &&
      kv_dtype != static_cast<uint8_t>(DType::f16) && kv_dtype != static_cast<uint8_t>(DType::q8_0)) {
    return bad("KV element type " + std::to_string(kv_dtype));
  }
  plan.kv_dtype = static_cast<DType>(kv_dtype);
  plan.shutdown = shutdown != 0;
  uint64_t n = 0;
  if (!r.get_count(&n, 16)) return bad("bad open count");
  plan.open.resize(n);
  for (SequenceOpen& o : plan.open) {
    if (!r.get(&o.seq) || !get_policy(r, &o.policy) || !r.get(&o.compress_at)) return bad("bad sequence open");
  }
  if (!r.get_count(&n, 16)) return bad("bad fork count");
  plan.forks.resize(n);
  for (SequenceFork& f : plan.forks) {
    if (!r.get(&f.src) || !r.get(&f.dst)) return bad("bad sequence fork");
  }
  if (!r.get_count(&n, 22)) return bad("bad item count");
  plan.items.resize(n);
  for (StepItem& it : plan.items) {
    uint8_t flags = 0, logits = 0;
    uint64_t num_tokens = 0;
    if (!r.get(&it.seq) || !r.get(&it.start_position) || !r.get(&flags) || !r.get(&logits) || flags > 3 ||
        logits > static_cast<uint8_t>(LogitsWanted::all) || !r.get_count(&num_tokens, 4)) {
      return bad("bad step item");
    }
    it.prefill = (flags & 1) != 0;
    it.layerwise = (flags & 2) != 0;
    it.logits = static_cast<LogitsWanted>(logits);
    it.tokens.resize(num_tokens);
    for (int32_t& t : it.tokens) r.get(&t);
  }
  if (!r.get_count(&n, 24)) return bad("bad dump count");
  plan.dumps.resize(n);
  for (SelectionDump& d : plan.dumps) {
    if (!r.get(&d.seq) || !r.get_string(&d.path) || !r.get(&d.prompt_tokens)) return bad("bad selection dump");
  }
  if (!r.get_count(&n, 8)) return bad("bad close count");
  plan.close.resize(n);
  for (uint64_t& s : plan.close) r.get(&s);
  uint8_t report = 0;
  if (!r.get(&report) || report > 1) return bad("bad report flag");
  plan.report = report != 0;
  if (!r.done()) return bad("trailing bytes");
  return plan;
}

}  // namespace snap
