// The request header tp rank 0 sends the other ranks of a tensor-parallel device group
// (coordinator/engine/device_request.h): every field a follower's loop reads survives the
// round trip, the shutdown header is one flag, and malformed bytes (every truncation, a
// negative length, trailing bytes) are a data_loss error, never a crash or a wrong request.
// The same for serve's per-operation DeviceOp.
#include <gtest/gtest.h>

#include <cstring>

#include "coordinator/engine/device_request.h"

namespace snap {
namespace {

DeviceRequestHeader sample() {
  DeviceRequestHeader h;
  GenerateRequest& r = h.req;
  r.prompt_ids = {1, 22, 333, 4444, 0, 7};
  r.max_tokens = 77;
  r.prefill_chunk = 123;
  r.auto_layerwise = false;
  r.kv_block_size = 16;
  r.kv_pool_bytes = int64_t{5} << 33;  // beyond 32 bits
  r.context_limit = 1 << 20;
  r.kv_selection_dump = "/tmp/sel ection.json";
  KvPolicy& p = r.kv_policy;
  p.kind = KvPolicyKind::adakv;
  p.budget = 333;
  p.window = 17;
  p.kernel = 9;
  p.pooling = KvPooling::max;
  p.aggregation = GqaAggregation::max;
  p.num_sink = 3;
  p.adakv_alpha = 0.35;
  p.pyramid_beta = 11;
  p.context_tokens = 5;
  p.layerwise = true;
  h.prompt_logits = true;
  return h;
}

TEST(DeviceRequest, EveryFieldSurvivesTheRoundTrip) {
  const DeviceRequestHeader h = sample();
  const std::vector<uint8_t> bytes = encode_device_request(h);
  auto d = decode_device_request(bytes);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_FALSE(d->shutdown);
  EXPECT_TRUE(d->prompt_logits);
  const GenerateRequest &a = h.req, &b = d->req;
  EXPECT_EQ(b.prompt_ids, a.prompt_ids);
  EXPECT_EQ(b.max_tokens, a.max_tokens);
  EXPECT_EQ(b.prefill_chunk, a.prefill_chunk);
  EXPECT_EQ(b.auto_layerwise, a.auto_layerwise);
  EXPECT_EQ(b.kv_block_size, a.kv_block_size);
  EXPECT_EQ(b.kv_pool_bytes, a.kv_pool_bytes);
  EXPECT_EQ(b.context_limit, a.context_limit);
  EXPECT_EQ(b.kv_selection_dump, a.kv_selection_dump);
  EXPECT_EQ(b.kv_dtype, DType::bf16);
  const KvPolicy &p = a.kv_policy, &q = b.kv_policy;
  EXPECT_EQ(q.kind, p.kind);
  EXPECT_EQ(q.budget, p.budget);
  EXPECT_EQ(q.window, p.window);
  EXPECT_EQ(q.kernel, p.kernel);
  EXPECT_EQ(q.pooling, p.pooling);
  EXPECT_EQ(q.aggregation, p.aggregation);
  EXPECT_EQ(q.num_sink, p.num_sink);
  EXPECT_EQ(q.adakv_alpha, p.adakv_alpha);
  EXPECT_EQ(q.pyramid_beta, p.pyramid_beta);
  EXPECT_EQ(q.context_tokens, p.context_tokens);
  EXPECT_EQ(q.layerwise, p.layerwise);
  // The defaults too (an empty dump path, no prompt logits, auto layer-wise on).
  DeviceRequestHeader plain;
  plain.req.prompt_ids = {5};
  auto e = decode_device_request(encode_device_request(plain));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_TRUE(e->req.kv_selection_dump.empty());
  EXPECT_FALSE(e->prompt_logits);
  EXPECT_TRUE(e->req.auto_layerwise);
  EXPECT_EQ(e->req.kv_policy.kind, KvPolicyKind::full);
  EXPECT_EQ(e->req.kv_policy.pooling, KvPooling::avg);
}

TEST(DeviceRequest, ShutdownIsOneFlag) {
  DeviceRequestHeader h;
  h.shutdown = true;
  const std::vector<uint8_t> bytes = encode_device_request(h);
  EXPECT_EQ(bytes.size(), 8u);
  auto d = decode_device_request(bytes);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_TRUE(d->shutdown);
}

TEST(DeviceRequest, MalformedBytesAreDataLoss) {
  const std::vector<uint8_t> bytes = encode_device_request(sample());
  for (size_t n = 0; n < bytes.size(); ++n) {  // every truncation
    auto d = decode_device_request(std::span<const uint8_t>(bytes.data(), n));
    ASSERT_FALSE(d.ok()) << "truncated to " << n << " of " << bytes.size() << " bytes was accepted";
    EXPECT_EQ(d.status().code(), StatusCode::k_data_loss) << d.status().to_string();
    EXPECT_NE(d.status().message().find("device request header"), std::string::npos) << d.status().message();
  }
  std::vector<uint8_t> trailing = bytes;
  trailing.push_back(0);
  EXPECT_FALSE(decode_device_request(trailing).ok());
  std::vector<uint8_t> shut = encode_device_request(DeviceRequestHeader{true, {}, false});
  shut.push_back(1);
  EXPECT_FALSE(decode_device_request(shut).ok());
  // A negative prompt length (field 9, after the flag and eight fields).
  std::vector<uint8_t> negative = bytes;
  const int64_t minus = -1;
  std::memcpy(negative.data() + 8 * 9, &minus, 8);
  auto d = decode_device_request(negative);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("negative"), std::string::npos) << d.status().message();
  // A prompt longer than the bytes that follow.
  std::vector<uint8_t> huge = bytes;
  const int64_t many = int64_t{1} << 40;
  std::memcpy(huge.data() + 8 * 9, &many, 8);
  EXPECT_FALSE(decode_device_request(huge).ok());
}

TEST(DeviceOp, EveryFieldSurvivesTheRoundTrip) {
  DeviceOp op;
  op.kind = DeviceOpKind::layerwise;
  op.seq = 41;
  op.compress_at = int64_t{3} << 33;
  op.chunk = 512;
  op.disarm = true;
  op.all_logits = true;
  op.policy = sample().req.kv_policy;
  op.seqs = {3, 1, 4};
  op.tokens = {1, 5, 9, 26, 0};
  auto d = decode_device_op(encode_device_op(op));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->kind, op.kind);
  EXPECT_EQ(d->seq, op.seq);
  EXPECT_EQ(d->compress_at, op.compress_at);
  EXPECT_EQ(d->chunk, op.chunk);
  EXPECT_TRUE(d->disarm);
  EXPECT_TRUE(d->all_logits);
  EXPECT_EQ(d->seqs, op.seqs);
  EXPECT_EQ(d->tokens, op.tokens);
  const KvPolicy &a = d->policy, &b = op.policy;
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.budget, b.budget);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.kernel, b.kernel);
  EXPECT_EQ(a.pooling, b.pooling);
  EXPECT_EQ(a.aggregation, b.aggregation);
  EXPECT_EQ(a.adakv_alpha, b.adakv_alpha);
  EXPECT_EQ(a.context_tokens, b.context_tokens);
  EXPECT_EQ(a.layerwise, b.layerwise);
  for (DeviceOpKind k : {DeviceOpKind::shutdown, DeviceOpKind::open, DeviceOpKind::forward, DeviceOpKind::compress,
                         DeviceOpKind::decode, DeviceOpKind::release, DeviceOpKind::report, DeviceOpKind::fork}) {
    DeviceOp plain;
    plain.kind = k;
    auto e = decode_device_op(encode_device_op(plain));
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(e->kind, k);
    EXPECT_TRUE(e->seqs.empty() && e->tokens.empty());
    EXPECT_FALSE(e->disarm || e->all_logits);
  }
}

TEST(DeviceOp, MalformedBytesAreDataLoss) {
  DeviceOp op;
  op.kind = DeviceOpKind::decode;
  op.seqs = {0, 2};
  op.tokens = {7, 8};
  const std::vector<uint8_t> bytes = encode_device_op(op);
  for (size_t n = 0; n < bytes.size(); ++n) {  // every truncation
    auto d = decode_device_op(std::span<const uint8_t>(bytes.data(), n));
    ASSERT_FALSE(d.ok()) << "truncated to " << n << " of " << bytes.size() << " bytes was accepted";
    EXPECT_EQ(d.status().code(), StatusCode::k_data_loss) << d.status().to_string();
    EXPECT_NE(d.status().message().find("device op"), std::string::npos) << d.status().message();
  }
  std::vector<uint8_t> trailing = bytes;
  trailing.push_back(0);
  EXPECT_FALSE(decode_device_op(trailing).ok());
  std::vector<uint8_t> unknown = bytes;
  const int64_t kind = 99;
  std::memcpy(unknown.data(), &kind, 8);
  auto u = decode_device_op(unknown);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("unknown kind 99"), std::string::npos) << u.status().message();
  std::vector<uint8_t> flags = bytes;
  const int64_t bad_flags = 4;
  std::memcpy(flags.data() + 8 * 4, &bad_flags, 8);
  auto fl = decode_device_op(flags);
  ASSERT_FALSE(fl.ok());
  EXPECT_NE(fl.status().message().find("unknown flags 4"), std::string::npos) << fl.status().message();
  std::vector<uint8_t> negative = bytes;
  const int64_t minus = -1;
  std::memcpy(negative.data() + 8 * 5, &minus, 8);  // the number of sequences
  EXPECT_FALSE(decode_device_op(negative).ok());
  std::vector<uint8_t> huge = bytes;
  const int64_t many = int64_t{1} << 40;
  std::memcpy(huge.data() + 8 * 6, &many, 8);  // the number of tokens
  EXPECT_FALSE(decode_device_op(huge).ok());
}

}  // namespace
}  // namespace snap
