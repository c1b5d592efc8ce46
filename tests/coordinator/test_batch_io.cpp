// batch_io: shard specs and Slurm array variables, input-line parsing (each malformed
// shape gives an error naming it), records, the output file's resume scan (partial last
// line cut, duplicates and foreign records refused), and merge (input order; missing,
// duplicate, wrong-id and partial shard files refused without touching the output).
#include "coordinator/batch/batch_io.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/worker/tiny_checkpoint.h"

namespace snap {
namespace {

using nlohmann::json;

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string line_json(const std::string& id, const std::string& url = "/v1/completions") {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", {{"prompt", "hi"}, {"max_tokens", 2}}}}.dump();
}

std::string ok_record(int64_t line, const std::string& id) {
  BatchInput in;
  in.line = line;
  in.custom_id = id;
  return batch_output_record(in, 200, "cmpl-x", R"({"choices":[]})", "", "", nullptr);
}

TEST(BatchShard, ParseAndOwnership) {
  auto s = parse_shard("1/3");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->index, 1);
  EXPECT_EQ(s->count, 3);
  // Round robin over 1-based lines: shard 1 of 3 has lines 2, 5, 8, ...
  EXPECT_FALSE(s->owns(1));
  EXPECT_TRUE(s->owns(2));
  EXPECT_TRUE(s->owns(5));
  EXPECT_FALSE(s->owns(6));
  for (const char* bad : {"3/3", "-1/3", "1", "a/3", "1/0", "1/x", "", "1/3/4"}) {
    auto r = parse_shard(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--shard"), std::string::npos) << r.status().message();
    }
  }
  EXPECT_EQ(shard_output_path("out.jsonl", ShardSpec{}), "out.jsonl");
  EXPECT_EQ(shard_output_path("out.jsonl", ShardSpec{2, 4}), "out.jsonl.2-of-4");
}

TEST(BatchShard, FromSlurmArrayVariables) {
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  ::unsetenv("SLURM_ARRAY_TASK_COUNT");
  ::unsetenv("SLURM_ARRAY_TASK_MIN");
  auto none = shard_from_environment();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->count, 1);
  // --array=4-6: task 5 is shard 1 of 3.
  ::setenv("SLURM_ARRAY_TASK_ID", "5", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "4", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "3", 1);
  auto s = shard_from_environment();
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->index, 1);
  EXPECT_EQ(s->count, 3);
  // --array=0,7 (not contiguous): task 7 of 2 tasks is not a shard.
  ::setenv("SLURM_ARRAY_TASK_ID", "7", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "0", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "2", 1);
  auto bad = shard_from_environment();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("SLURM_ARRAY_TASK_ID=7"), std::string::npos) << bad.status().message();
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  ::unsetenv("SLURM_ARRAY_TASK_COUNT");
  ::unsetenv("SLURM_ARRAY_TASK_MIN");
}

TEST(BatchInputLine, ParsesBothRoutes) {
  BatchInput a = parse_batch_line(3, line_json("x1"));
  EXPECT_FALSE(a.error) << *a.error;
  EXPECT_EQ(a.line, 3);
  EXPECT_EQ(a.custom_id, "x1");
  EXPECT_EQ(a.url, BatchUrl::completions);
  EXPECT_EQ(json::parse(a.body)["max_tokens"], 2);
  BatchInput b = parse_batch_line(4, line_json("x2", "/v1/chat/completions"));
  EXPECT_FALSE(b.error);
  EXPECT_EQ(b.url, BatchUrl::chat_completions);
  // method may be omitted.
  BatchInput c = parse_batch_line(5, R"({"custom_id": "x3", "url": "/v1/completions", "body": {}})");
  EXPECT_FALSE(c.error);
  EXPECT_TRUE(batch_line_is_blank("  \t\r"));
  EXPECT_FALSE(batch_line_is_blank(" {}"));
}

TEST(BatchInputLine, EachBadShapeIsNamed) {
  struct Case {
    const char* text;
    const char* says;
    const char* custom_id;
  };
  const Case cases[] = {
      {R"({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "unterminated)", "not valid JSON", ""},
      {R"([1, 2])", "JSON object", ""},
      {R"({"url": "/v1/completions", "body": {}})", "custom_id is required", ""},
      {R"({"custom_id": 7, "url": "/v1/completions", "body": {}})", "custom_id is required", ""},
      {R"({"custom_id": "", "url": "/v1/completions", "body": {}})", "must not be empty", ""},
      {R"({"custom_id": "b", "method": "GET", "url": "/v1/completions", "body": {}})", "method must be", "b"},
      {R"({"custom_id": "c", "body": {}})", "url is required", "c"},
      {R"({"custom_id": "d", "url": "/v1/embeddings", "body": {}})", "/v1/embeddings", "d"},
      {R"({"custom_id": "e", "url": "/v1/completions", "body": "text"})", "body is required", "e"},
  };
  for (const Case& k : cases) {
    BatchInput in = parse_batch_line(9, k.text);
    ASSERT_TRUE(in.error) << k.text;
    EXPECT_NE(in.error->find(k.says), std::string::npos) << *in.error;
    EXPECT_EQ(in.custom_id, k.custom_id) << k.text;
    EXPECT_EQ(in.line, 9);
  }
}

TEST(BatchRecord, FieldsAndOneLine) {
  BatchInput in;
  in.line = 12;
  in.custom_id = "doc-12";
  BatchTruncation t{"left", 5000, 2000};
  const std::string r =
      batch_output_record(in, 200, "cmpl-abc", R"({"choices":[{"text":"a\nb"}]})", "", "", &t);
  ASSERT_EQ(r.back(), '\n');
  EXPECT_EQ(r.find('\n'), r.size() - 1) << "a record is exactly one line";
  const json j = json::parse(r);
  EXPECT_EQ(j["id"], "batch_req_12");
  EXPECT_EQ(j["custom_id"], "doc-12");
  EXPECT_EQ(j["line"], 12);
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_EQ(j["response"]["status_code"], 200);
  EXPECT_EQ(j["response"]["request_id"], "cmpl-abc");
  EXPECT_EQ(j["response"]["body"]["choices"][0]["text"], "a\nb");  // an object, not a string
  EXPECT_EQ(j["truncated"]["side"], "left");
  EXPECT_EQ(j["truncated"]["prompt_tokens_before"], 5000);

  BatchInput bad;
  bad.line = 7;
  const json e = json::parse(batch_output_record(bad, 400, "", R"({"error":{}})", "invalid_value", "line 7: oops", nullptr));
  EXPECT_TRUE(e["custom_id"].is_null());
  EXPECT_EQ(e["error"]["code"], "invalid_value");
  EXPECT_EQ(e["error"]["message"], "line 7: oops");
  EXPECT_FALSE(e.contains("truncated"));
}

TEST(BatchOutputFile, ResumeCutsAPartialLineAndSkipsDoneLines) {
  testing::TempDir dir("batchio");
  const std::string out = dir / "out.jsonl";
  {
    auto o = BatchOutput::open(out, ShardSpec{});
    ASSERT_TRUE(o.ok()) << o.status().message();
    EXPECT_EQ(o->records(), 0);
    ASSERT_TRUE(o->append(2, ok_record(2, "b")).ok());
    ASSERT_TRUE(o->append(1, ok_record(1, "a")).ok());
    EXPECT_TRUE(o->done(1));
    EXPECT_FALSE(o->done(3));
  }
  const std::string whole = slurp(out);
  // A kill in the middle of writing line 3's record.
  const std::string third = ok_record(3, "c");
  spit(out, whole + third.substr(0, third.size() / 2));
  auto o = BatchOutput::open(out, ShardSpec{});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->records(), 2);
  EXPECT_TRUE(o->done(1));
  EXPECT_TRUE(o->done(2));
  EXPECT_FALSE(o->done(3));
  EXPECT_EQ(o->dropped_partial_bytes(), static_cast<int64_t>(third.size() / 2));
  EXPECT_EQ(slurp(out), whole) << "the partial line is cut from the file";
  ASSERT_TRUE(o->append(3, third).ok());
  EXPECT_EQ(slurp(out), whole + third);
}

TEST(BatchOutputFile, RefusesWhatIsNotOurs) {
  testing::TempDir dir("batchio");
  const std::string dup = dir / "dup.jsonl";
  spit(dup, ok_record(1, "a") + ok_record(4, "d") + ok_record(1, "a"));
  auto d = BatchOutput::open(dup, ShardSpec{0, 3});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("input line 1 is recorded twice"), std::string::npos) << d.status().message();

  const std::string other = dir / "other.jsonl";
  spit(other, ok_record(2, "b"));
  auto s = BatchOutput::open(other, ShardSpec{0, 3});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("another shard"), std::string::npos) << s.status().message();

  const std::string foreign = dir / "foreign.jsonl";
  spit(foreign, "hello world\n");
  auto f = BatchOutput::open(foreign, ShardSpec{});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("not a snapserve batch record"), std::string::npos) << f.status().message();
  EXPECT_EQ(slurp(foreign), "hello world\n") << "a refused file is left as it was";
}

class BatchMerge : public ::testing::Test {
 protected:
  void SetUp() override {
    // Lines 1..7, line 4 blank: shard 0 of 2 owns 1, 3, 5, 7; shard 1 owns 2, (4), 6.
    std::string text;
    for (int k = 1; k <= 7; ++k) text += (k == 4 ? std::string("   ") : line_json("id" + std::to_string(k))) + "\n";
    spit(input_, text);
  }
  void write_shards(const std::string& extra0 = "", const std::string& extra1 = "") {
    spit(out_ + ".0-of-2", ok_record(5, "id5") + ok_record(1, "id1") + ok_record(7, "id7") + ok_record(3, "id3") + extra0);
    spit(out_ + ".1-of-2", ok_record(6, "id6") + ok_record(2, "id2") + extra1);
  }
  testing::TempDir dir_{"batchmerge"};
  std::string input_ = dir_ / "in.jsonl";
  std::string out_ = dir_ / "out.jsonl";
};

TEST_F(BatchMerge, WritesInputOrder) {
  write_shards();
  auto r = merge_batch_outputs(input_, out_, 2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->input_records, 6);
  EXPECT_EQ(r->errors, 0);
  EXPECT_EQ(slurp(out_), ok_record(1, "id1") + ok_record(2, "id2") + ok_record(3, "id3") + ok_record(5, "id5") +
                             ok_record(6, "id6") + ok_record(7, "id7"));
}

TEST_F(BatchMerge, RefusesMissingDuplicateWrongIdAndPartial) {
  spit(out_, "previous\n");
  spit(out_ + ".0-of-2", ok_record(5, "id5") + ok_record(1, "id1") + ok_record(7, "id7"));  // no line 3
  spit(out_ + ".1-of-2", ok_record(6, "id6") + ok_record(2, "id2"));
  auto missing = merge_batch_outputs(input_, out_, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no result for input lines 3"), std::string::npos) << missing.status().message();

  write_shards("", ok_record(2, "id2"));
  auto dup = merge_batch_outputs(input_, out_, 2);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("more than one result for input lines 2"), std::string::npos)
      << dup.status().message();

  spit(out_ + ".0-of-2", ok_record(5, "id5") + ok_record(1, "zzz") + ok_record(7, "id7") + ok_record(3, "id3"));
  spit(out_ + ".1-of-2", ok_record(6, "id6") + ok_record(2, "id2"));
  auto wrong = merge_batch_outputs(input_, out_, 2);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("custom_id differs from the input on lines 1"), std::string::npos)
      << wrong.status().message();

  write_shards();
  spit(out_ + ".1-of-2", slurp(out_ + ".1-of-2") + "{\"line\": 4");
  auto partial = merge_batch_outputs(input_, out_, 2);
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("partial"), std::string::npos) << partial.status().message();

  std::remove((out_ + ".1-of-2").c_str());
  auto absent = merge_batch_outputs(input_, out_, 2);
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.status().message().find("shard 1/2's output is missing"), std::string::npos) << absent.status().message();

  EXPECT_EQ(slurp(out_), "previous\n") << "a failed merge leaves the output alone";
}

TEST(BatchAtomicWrite, ReplacesWhole) {
  testing::TempDir dir("batchio");
  const std::string p = dir / "progress.json";
  ASSERT_TRUE(write_file_atomic(p, "one\n").ok());
  ASSERT_TRUE(write_file_atomic(p, "two\n").ok());
  EXPECT_EQ(slurp(p), "two\n");
  EXPECT_FALSE(write_file_atomic(dir / "no/such/dir/x", "y").ok());
}

}  // namespace
}  // namespace snap
