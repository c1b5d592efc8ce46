// `snapserve batch` files: the OpenAI Batch JSONL format (what vLLM's run-batch reads) in
// and out, shards of a corpus, and the output file as its own resume record. Pure I/O and
// parsing, no engine: batch_cli.cpp drives the engine with what this file reads.
//
// Exactly once: every result is one line ending in '\n', written with one write() and
// fdatasync'd before the next. Each line names its input line ("line": k). On a restart
// the output is scanned: a partial last line (a kill mid-write) is cut off, the lines
// already there are skipped. So no input line is ever written twice or half.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace snap {

// --- shards -------------------------------------------------------------------------

// Input line k (1-based) belongs to shard (k - 1) mod count: round robin spreads long and
// short documents evenly over the tasks of an array job.
struct ShardSpec {
  int index = 0;
  int count = 1;
  bool owns(int64_t line) const { return (line - 1) % count == index; }
  std::string name() const { return std::to_string(index) + "/" + std::to_string(count); }
};

// "I/N" with 0 <= I < N.
Result<ShardSpec> parse_shard(const std::string& text);
// Under a Slurm job array: SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN of
// SLURM_ARRAY_TASK_COUNT; otherwise 0/1. invalid_argument when the variables disagree.
Result<ShardSpec> shard_from_environment();
// The file a shard writes: `output` itself for one shard, else `output.I-of-N`.
std::string shard_output_path(const std::string& output, const ShardSpec& shard);

// --- input lines ------------------------------------------------------------------

enum class BatchUrl : uint8_t { completions, chat_completions };

struct BatchInput {
  int64_t line = 0;       // 1-based line number in the input file
  std::string custom_id;  // "" when the line has none (then it is an error record)
  BatchUrl url = BatchUrl::completions;
  std::string body;       // the request body, serialized JSON
  std::optional<std::string> error;  // set: this line cannot run; the message names the problem
};

// True for a line with nothing but whitespace: not a record, never given a result.
bool batch_line_is_blank(const std::string& text);
// Parses one input line: {"custom_id": string, "method": "POST", "url": ..., "body": {...}}.
// Never fails: a bad line comes back with `error` set (and custom_id when it had one).
BatchInput parse_batch_line(int64_t line, const std::string& text);

// --- output records -------------------------------------------------------------

struct BatchTruncation {
  std::string side;  // "left" | "right"
  int64_t prompt_tokens_before = 0;
  int64_t prompt_tokens_after = 0;
};

// {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error", "line"}
// plus "truncated" when the prompt was cut. `response_body` is serialized JSON (the
// completion, or an OpenAI error object); `error` is null on success, else
// {"code", "message"} with the line number in the message. One line, '\n'-terminated.
std::string batch_output_record(const BatchInput& in, int status_code, const std::string& request_id,
                                const std::string& response_body, const std::string& error_code,
                                const std::string& error_message, const BatchTruncation* truncated);

// --- the output file -----------------------------------------------------------------

// An output file opened for appending, after the scan described at the top of this file.
class BatchOutput {
 public:
  // Creates `path` or reopens it; drops a partial last line; refuses a line that is not
  // one of our records, a record of another shard, or a line recorded twice.
  static Result<BatchOutput> open(const std::string& path, const ShardSpec& shard);
  BatchOutput(BatchOutput&& other) noexcept;
  BatchOutput& operator=(BatchOutput&&) = delete;
  ~BatchOutput();

  bool done(int64_t line) const { return done_.count(line) != 0; }
  int64_t records() const { return static_cast<int64_t>(done_.size()); }
  int64_t dropped_partial_bytes() const { return dropped_partial_bytes_; }
  // Appends one record (a whole '\n'-terminated line) and fdatasyncs it.
  Status append(int64_t line, const std::string& record);

 private:
  BatchOutput(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  std::set<int64_t> done_;
  int64_t dropped_partial_bytes_ = 0;
};

// Writes `text` to `path` atomically: a temp file beside it, fsync, rename, fsync of the
// directory. Readers see the old or the new file, never a mix.
Status write_file_atomic(const std::string& path, const std::string& text);

// --- merge -------------------------------------------------------------------------

struct BatchMergeReport {
  int64_t input_records = 0;  // non-blank input lines
  int64_t errors = 0;         // records with a non-null "error"
};

// Reads every shard's output of `output` (shard_output_path for I = 0..shards-1), checks
// that each non-blank input line has exactly one record with the same custom_id and no
// record names a line that is not in the input, then writes `output` in input order
// (atomically). invalid_argument/data_loss naming the lines (the first few and a count).
Result<BatchMergeReport> merge_batch_outputs(const std::string& input, const std::string& output, int shards);

}  // namespace snap
