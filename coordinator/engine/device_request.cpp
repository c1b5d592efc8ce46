// encode_device_request / decode_device_request (device_request.h): little-endian int64
// fields, the dump path's bytes, the prompt's int32 ids, then the policy as an encoded
// StepPlan with one SequenceOpen (worker/step_plan.h owns the policy's encoding).
#include "coordinator/engine/device_request.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "worker/step_plan.h"

namespace snap {

namespace {
constexpr int k_fields = 9;  // after the shutdown flag

void put_i64(std::vector<uint8_t>& out, int64_t v) {
  const size_t at = out.size();
  out.resize(at + 8);
  std::memcpy(out.data() + at, &v, 8);
}
}  // namespace

std::vector<uint8_t> encode_device_request(const DeviceRequestHeader& h) {
  std::vector<uint8_t> out;
  put_i64(out, h.shutdown ? 1 : 0);
  if (h.shutdown) return out;
  const GenerateRequest& r = h.req;
  const int64_t fields[k_fields] = {r.max_tokens,   r.prefill_chunk,   int64_t{r.auto_layerwise},
                                    int64_t{r.kv_block_size}, r.kv_pool_bytes, r.context_limit,
                                    int64_t{h.prompt_logits}, static_cast<int64_t>(r.kv_selection_dump.size()),
                                    static_cast<int64_t>(r.prompt_ids.size())};
  for (int64_t v : fields) put_i64(out, v);
  out.insert(out.end(), r.kv_selection_dump.begin(), r.kv_selection_dump.end());
  const auto* ids = reinterpret_cast<const uint8_t*>(r.prompt_ids.data());
  out.insert(out.end(), ids, ids + 4 * r.prompt_ids.size());
  StepPlan plan;
  plan.open.push_back({0, r.kv_policy, 0});
  const std::vector<uint8_t> policy = encode_step_plan(plan);
  out.insert(out.end(), policy.begin(), policy.end());
  return out;
}

Result<DeviceRequestHeader> decode_device_request(std::span<const uint8_t> in) {
  size_t at = 0;
  auto i64 = [&](int64_t* v) -> bool {
    if (in.size() - at < 8) return false;
    std::memcpy(v, in.data() + at, 8);
    at += 8;
    return true;
  };
  DeviceRequestHeader h;
  int64_t flag = 0;
  if (!i64(&flag)) return data_loss("device request header: truncated (" + std::to_string(in.size()) + " bytes)");
  h.shutdown = flag != 0;
  if (h.shutdown) {
    if (at != in.size()) return data_loss("device request header: bytes after the shutdown flag");
    return h;
  }
  int64_t f[k_fields];
  for (int64_t& v : f)
    if (!i64(&v)) return data_loss("device request header: truncated in its fields");
  const int64_t path_len = f[7], num_ids = f[8];
  if (path_len < 0 || num_ids < 0) return data_loss("device request header: a negative length");
  if (static_cast<uint64_t>(in.size() - at) < static_cast<uint64_t>(path_len) + 4 * static_cast<uint64_t>(num_ids))
    return data_loss("device request header: truncated in the dump path or the prompt");
  GenerateRequest& r = h.req;
  r.max_tokens = f[0];
  r.prefill_chunk = f[1];
  r.auto_layerwise = f[2] != 0;
  r.kv_block_size = static_cast<int>(f[3]);
  r.kv_pool_bytes = f[4];
  r.context_limit = f[5];
  h.prompt_logits = f[6] != 0;
  r.kv_selection_dump.assign(reinterpret_cast<const char*>(in.data() + at), static_cast<size_t>(path_len));
  at += static_cast<size_t>(path_len);
  r.prompt_ids.resize(static_cast<size_t>(num_ids));
  if (num_ids > 0) std::memcpy(r.prompt_ids.data(), in.data() + at, 4 * r.prompt_ids.size());
  at += 4 * r.prompt_ids.size();
  Result<StepPlan> plan = decode_step_plan(in.subspan(at));
  if (!plan.ok()) return data_loss("device request header: its policy: " + plan.status().message());
  if (plan->open.size() != 1) return data_loss("device request header: no KV policy");
  r.kv_policy = plan->open[0].policy;
  r.kv_dtype = DType::bf16;
  return h;
}

// --- serve's DeviceOp: kind, seq, compress_at, chunk, flags (1: disarm, 2: all_logits), #seqs, #tokens (int64 each), the
// seqs and tokens (int32), then the policy as an encoded StepPlan with one SequenceOpen.
namespace {
constexpr int k_op_fields = 7;
}  // namespace

std::vector<uint8_t> encode_device_op(const DeviceOp& op) {
  std::vector<uint8_t> out;
  const int64_t fields[k_op_fields] = {static_cast<int64_t>(op.kind), op.seq, op.compress_at, op.chunk,
                                       int64_t{op.disarm} | int64_t{op.all_logits} << 1, static_cast<int64_t>(op.seqs.size()),
                                       static_cast<int64_t>(op.tokens.size())};
  for (int64_t v : fields) put_i64(out, v);
  for (const std::vector<int32_t>* list : {&op.seqs, &op.tokens}) {
    const size_t at = out.size();
    out.resize(at + 4 * list->size());
    if (!list->empty()) std::memcpy(out.data() + at, list->data(), 4 * list->size());
  }
  StepPlan plan;
  plan.open.push_back({0, op.policy, 0});
  const std::vector<uint8_t> policy = encode_step_plan(plan);
  const size_t at = out.size();
  out.resize(at + policy.size());
  std::memcpy(out.data() + at, policy.data(), policy.size());
  return out;
}

Result<DeviceOp> decode_device_op(std::span<const uint8_t> in) {
  if (in.size() < 8 * k_op_fields) return data_loss("device op: truncated (" + std::to_string(in.size()) + " bytes)");
  int64_t f[k_op_fields];
  std::memcpy(f, in.data(), sizeof f);
  size_t at = sizeof f;
  if (f[0] < 0 || f[0] > static_cast<int64_t>(DeviceOpKind::fork))
    return data_loss("device op: unknown kind " + std::to_string(f[0]));
  if (f[1] < -1 || f[1] > INT32_MAX || f[5] < 0 || f[6] < 0) return data_loss("device op: a negative length or bad sequence");
  if ((f[4] & ~int64_t{3}) != 0) return data_loss("device op: unknown flags " + std::to_string(f[4]));
  const uint64_t lists = 4 * (static_cast<uint64_t>(f[5]) + static_cast<uint64_t>(f[6]));
  if (static_cast<uint64_t>(in.size() - at) < lists) return data_loss("device op: truncated in its sequences or tokens");
  DeviceOp op;
  op.kind = static_cast<DeviceOpKind>(f[0]);
  op.seq = static_cast<int32_t>(f[1]);
  op.compress_at = f[2];
  op.chunk = f[3];
  op.disarm = (f[4] & 1) != 0;
  op.all_logits = (f[4] & 2) != 0;
  op.seqs.resize(static_cast<size_t>(f[5]));
  op.tokens.resize(static_cast<size_t>(f[6]));
  for (std::vector<int32_t>* list : {&op.seqs, &op.tokens}) {
    if (!list->empty()) std::memcpy(list->data(), in.data() + at, 4 * list->size());
    at += 4 * list->size();
  }
  Result<StepPlan> plan = decode_step_plan(in.subspan(at));
  if (!plan.ok()) return data_loss("device op: its policy: " + plan.status().message());
  if (plan->open.size() != 1) return data_loss("device op: no KV policy");
  op.policy = plan->open[0].policy;
  return op;
}

}  // namespace snap
