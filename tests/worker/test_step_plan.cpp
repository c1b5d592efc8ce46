// StepPlan encoding: every field survives a round trip, and truncated, padded or corrupted
// bytes are refused with a message rather than misread (a worker rank must never run a
// half-read plan).
#include <gtest/gtest.h>

#include "worker/step_plan.h"

namespace snap {
namespace {

StepPlan sample_plan() {
  StepPlan p;
  p.pool_bytes = 123456789;
  p.block_size = 32;
  p.kv_dtype = DType::bf16;
  p.chunk = 77;
  KvPolicy policy;
  policy.kind = KvPolicyKind::pyramidkv;
  policy.budget = 300;
  policy.window = 12;
  policy.kernel = 5;
  policy.pooling = KvPooling::avg;
  policy.aggregation = GqaAggregation::max;
  policy.num_sink = 3;
  policy.adakv_alpha = 0.35;
  policy.pyramid_beta = 9;
  policy.context_tokens = 40;
  policy.layerwise = true;
  p.open.push_back({7, policy, 40});
  p.open.push_back({9, KvPolicy{}, 11});
  p.forks.push_back({7, 12});
  p.forks.push_back({7, 13});
  p.items.push_back({7, 0, {1, 2, 3, 4}, true, false, LogitsWanted::none});
  p.items.push_back({9, 55, {42}, false, false, LogitsWanted::last});
  p.items.push_back({11, 3, {5, 6}, true, true, LogitsWanted::all});
  p.dumps.push_back({7, "/tmp/sel.json", 120});
  p.close = {3, 5};
  p.report = true;
  return p;
}

TEST(StepPlan, RoundTripKeepsEveryField) {
  const StepPlan p = sample_plan();
  auto d = decode_step_plan(encode_step_plan(p));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->shutdown, false);
  EXPECT_EQ(d->pool_bytes, p.pool_bytes);
  EXPECT_EQ(d->block_size, p.block_size);
  EXPECT_EQ(d->kv_dtype, DType::bf16);
  EXPECT_EQ(d->chunk, p.chunk);
  ASSERT_EQ(d->open.size(), 2u);
  const KvPolicy& a = d->open[0].policy;
  const KvPolicy& b = p.open[0].policy;
  EXPECT_EQ(d->open[0].seq, 7u);
  EXPECT_EQ(d->open[0].compress_at, 40);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.budget, b.budget);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.kernel, b.kernel);
  EXPECT_EQ(a.pooling, b.pooling);
  EXPECT_EQ(a.aggregation, b.aggregation);
  EXPECT_EQ(a.num_sink, b.num_sink);
  EXPECT_EQ(a.adakv_alpha, b.adakv_alpha);
  EXPECT_EQ(a.pyramid_beta, b.pyramid_beta);
  EXPECT_EQ(a.context_tokens, b.context_tokens);
  EXPECT_EQ(a.layerwise, b.layerwise);
  EXPECT_EQ(d->open[1].policy.kind, KvPolicyKind::full);
  ASSERT_EQ(d->forks.size(), 2u);
  EXPECT_EQ(d->forks[1].src, 7u);
  EXPECT_EQ(d->forks[1].dst, 13u);
  ASSERT_EQ(d->items.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d->items[i].seq, p.items[i].seq);
    EXPECT_EQ(d->items[i].start_position, p.items[i].start_position);
    EXPECT_EQ(d->items[i].tokens, p.items[i].tokens);
    EXPECT_EQ(d->items[i].prefill, p.items[i].prefill);
    EXPECT_EQ(d->items[i].layerwise, p.items[i].layerwise);
    EXPECT_EQ(d->items[i].logits, p.items[i].logits);
  }
  ASSERT_EQ(d->dumps.size(), 1u);
  EXPECT_EQ(d->dumps[0].path, "/tmp/sel.json");
  EXPECT_EQ(d->dumps[0].prompt_tokens, 120);
  EXPECT_EQ(d->close, p.close);
  EXPECT_TRUE(d->report);

  StepPlan bye;
  bye.shutdown = true;
  auto s = decode_step_plan(encode_step_plan(bye));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->shutdown);
  EXPECT_TRUE(s->items.empty());
}

TEST(StepPlan, EveryTruncationIsRefused) {
  const std::vector<uint8_t> bytes = encode_step_plan(sample_plan());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto d = decode_step_plan(std::span<const uint8_t>(bytes.data(), n));
    EXPECT_FALSE(d.ok()) << "accepted " << n << " of " << bytes.size() << " bytes";
    if (!d.ok()) {
      EXPECT_NE(d.status().message().find("malformed step plan"), std::string::npos);
    }
  }
  std::vector<uint8_t> padded = bytes;
  padded.push_back(0);
  auto d = decode_step_plan(padded);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("trailing bytes"), std::string::npos);
}

TEST(StepPlan, BadVersionAndEnumsAreRefused) {
  std::vector<uint8_t> bytes = encode_step_plan(sample_plan());
  bytes[0] = 99;
  auto d = decode_step_plan(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("same snapserve"), std::string::npos) << d.status().message();

  // The first open's policy kind sits right after the header and the open count and seq.
  bytes = encode_step_plan(sample_plan());
  const size_t kind_at = 1 + 1 + 8 + 4 + 1 + 8 + 8 + 8;
  ASSERT_EQ(bytes[kind_at], static_cast<uint8_t>(KvPolicyKind::pyramidkv));
  bytes[kind_at] = 200;
  d = decode_step_plan(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("bad sequence open"), std::string::npos) << d.status().message();

  // The KV element type follows the block size; q4_0 is a weight format, not a KV type (q8_0 is).
  bytes = encode_step_plan(sample_plan());
  const size_t dtype_at = 1 + 1 + 8 + 4;
  ASSERT_EQ(bytes[dtype_at], static_cast<uint8_t>(DType::bf16));
  bytes[dtype_at] = static_cast<uint8_t>(DType::q4_0);
  d = decode_step_plan(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("KV element type"), std::string::npos) << d.status().message();
}

TEST(StepPlan, HugeCountsDoNotAllocate) {
  std::vector<uint8_t> bytes = encode_step_plan(StepPlan{});
  // Header (1 + 1 + 8 + 4 + 8), then the open count: claim 2^60 opens.
  const size_t count_at = 1 + 1 + 8 + 4 + 8;
  for (int i = 0; i < 8; ++i) bytes[count_at + i] = i == 7 ? 0x10 : 0;
  auto d = decode_step_plan(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("bad open count"), std::string::npos);
}

}  // namespace
}  // namespace snap
