// The batch files (see batch_io.h): shard specs, input-line parsing, output records, the
// append-only output with its resume scan, atomic writes, and the merge of shard outputs.
// nlohmann exceptions are caught here and never leave this file.
#include "coordinator/batch/batch_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

namespace snap {
namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string errno_text() { return std::strerror(errno); }

Result<int64_t> parse_int(const std::string& text, const std::string& what) {
  if (text.empty()) return invalid_argument(what + " is empty");
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return invalid_argument(what + " is not an integer: '" + text + "'");
  return static_cast<int64_t>(v);
}

// Writes all of `data` (write() may take less than asked).
Status write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return data_loss(path + ": write failed: " + errno_text());
    }
    done += static_cast<size_t>(n);
  }
  return Status();
}

// "first few line numbers (and N more)" for error messages about many lines.
std::string some_lines(const std::vector<int64_t>& lines) {
  std::string s;
  const size_t show = std::min<size_t>(lines.size(), 10);
  for (size_t i = 0; i < show; ++i) s += (i ? ", " : "") + std::to_string(lines[i]);
  if (lines.size() > show) s += " and " + std::to_string(lines.size() - show) + " more";
  return s;
}

}  // namespace

// --- shards ----------------------------------------------------------------------------

Result<ShardSpec> parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return invalid_argument("--shard must be I/N (e.g. 0/4), got '" + text + "'");
  SNAP_ASSIGN_OR_RETURN(int64_t index, parse_int(text.substr(0, slash), "--shard index"));
  SNAP_ASSIGN_OR_RETURN(int64_t count, parse_int(text.substr(slash + 1), "--shard count"));
  if (count < 1 || count > 1000000) return invalid_argument("--shard count must be in [1, 1000000], got " + text);
  if (index < 0 || index >= count) return invalid_argument("--shard index must be in [0, N), got " + text);
  return ShardSpec{static_cast<int>(index), static_cast<int>(count)};
}

Result<ShardSpec> shard_from_environment() {
  const char* id = std::getenv("SLURM_ARRAY_TASK_ID");
  const char* count = std::getenv("SLURM_ARRAY_TASK_COUNT");
  if (!id || !count) return ShardSpec{};
  const char* min = std::getenv("SLURM_ARRAY_TASK_MIN");
  SNAP_ASSIGN_OR_RETURN(int64_t task, parse_int(id, "SLURM_ARRAY_TASK_ID"));
  SNAP_ASSIGN_OR_RETURN(int64_t n, parse_int(count, "SLURM_ARRAY_TASK_COUNT"));
  int64_t lo = 0;
  if (min) {
    SNAP_ASSIGN_OR_RETURN(lo, parse_int(min, "SLURM_ARRAY_TASK_MIN"));
  }
  const int64_t index = task - lo;
  if (n < 1 || index < 0 || index >= n) {
    return invalid_argument("SLURM_ARRAY_TASK_ID=" + std::string(id) + " (min " + std::to_string(lo) + ") is not one of " +
                            std::to_string(n) + " consecutive tasks; submit with --array=0-" + std::to_string(n - 1) +
                            " (no step) or pass --shard I/N");
  }
  return ShardSpec{static_cast<int>(index), static_cast<int>(n)};
}

std::string shard_output_path(const std::string& output, const ShardSpec& shard) {
  if (shard.count == 1) return output;
  return output + "." + std::to_string(shard.index) + "-of-" + std::to_string(shard.count);
}

// --- input lines ------------------------------------------------------------------------

bool batch_line_is_blank(const std::string& text) {
  return text.find_first_not_of(" \t\r\n") == std::string::npos;
}

BatchInput parse_batch_line(int64_t line, const std::string& text) {
  BatchInput in;
  in.line = line;
  auto fail = [&](const std::string& message) {
    in.error = message;
    return in;
  };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return fail(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return fail("a line must be a JSON object, got " + std::string(j.type_name()));
  auto id = j.find("custom_id");
  if (id != j.end() && id->is_string()) in.custom_id = id->get<std::string>();
  if (id == j.end() || !id->is_string()) return fail("custom_id is required and must be a string");
  if (in.custom_id.empty()) return fail("custom_id must not be empty");
  auto method = j.find("method");
  if (method != j.end() && !(method->is_string() && method->get<std::string>() == "POST")) {
    return fail("method must be \"POST\", got " + dump(*method));
  }
  auto url = j.find("url");
  if (url == j.end() || !url->is_string()) return fail("url is required (/v1/completions or /v1/chat/completions)");
  const std::string u = url->get<std::string>();
  if (u == "/v1/completions") {
    in.url = BatchUrl::completions;
  } else if (u == "/v1/chat/completions") {
    in.url = BatchUrl::chat_completions;
  } else {
    return fail("url must be /v1/completions or /v1/chat/completions, got \"" + u + "\"");
  }
  auto body = j.find("body");
  if (body == j.end() || !body->is_object()) return fail("body is required and must be a JSON object");
  in.body = dump(*body);
  return in;
}

// --- output records --------------------------------------------------------------------

std::string batch_output_record(const BatchInput& in, int status_code, const std::string& request_id,
                                const std::string& response_body, const std::string& error_code,
                                const std::string& error_message, const BatchTruncation* truncated) {
  json r;
  r["id"] = "batch_req_" + std::to_string(in.line);
  r["custom_id"] = in.custom_id.empty() ? json(nullptr) : json(in.custom_id);
  json body;
  try {
    body = json::parse(response_body);
  } catch (const json::exception&) {
    body = response_body;  // never happens for our own bodies; keep the text rather than lose it
  }
  r["response"] = {{"status_code", status_code}, {"request_id", request_id}, {"body", body}};
  r["error"] = error_code.empty() ? json(nullptr) : json{{"code", error_code}, {"message", error_message}};
  r["line"] = in.line;
  if (truncated) {
    r["truncated"] = {{"side", truncated->side},
                      {"prompt_tokens_before", truncated->prompt_tokens_before},
                      {"prompt_tokens_after", truncated->prompt_tokens_after}};
  }
  return dump(r) + "\n";
}

// --- the output file ---------------------------------------------------------------------

Result<BatchOutput> BatchOutput::open(const std::string& path, const ShardSpec& shard) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return not_found(path + ": cannot open the output for appending: " + errno_text());
  BatchOutput out(path, fd);

  // Read what is there. Our lines are JSON objects: no raw '\n' inside one.
  std::string text;
  {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return data_loss(path + ": cannot stat: " + errno_text());
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return data_loss(path + ": cannot read the existing output: " + errno_text());
      got += static_cast<size_t>(n);
    }
  }
  const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (keep < text.size()) {  // a line cut by a kill mid-write: its input line runs again
    if (::ftruncate(fd, static_cast<off_t>(keep)) != 0 || ::fdatasync(fd) != 0) {
      return data_loss(path + ": cannot cut the partial last line: " + errno_text());
    }
    out.dropped_partial_bytes_ = static_cast<int64_t>(text.size() - keep);
  }
  int64_t row = 0;
  for (size_t at = 0; at < keep;) {
    const size_t nl = text.find('\n', at);
    const std::string record = text.substr(at, nl - at);
    at = nl + 1;
    ++row;
    int64_t line = -1;
    try {
      const json j = json::parse(record);
      if (j.is_object() && j.contains("line") && j["line"].is_number_integer()) line = j["line"].get<int64_t>();
    } catch (const json::exception&) {
    }
    if (line < 1) {
      return data_loss(path + ": output line " + std::to_string(row) +
                       " is not a snapserve batch record (no \"line\"); is this the right --output?");
    }
    if (!shard.owns(line)) {
      return invalid_argument(path + ": output line " + std::to_string(row) + " holds input line " + std::to_string(line) +
                              ", which belongs to another shard than " + shard.name() +
                              "; resume with the --shard the file was started with");
    }
    if (!out.done_.insert(line).second) {
      return data_loss(path + ": input line " + std::to_string(line) + " is recorded twice (output line " +
                       std::to_string(row) + ")");
    }
  }
  return out;
}

BatchOutput::BatchOutput(BatchOutput&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), done_(std::move(o.done_)), dropped_partial_bytes_(o.dropped_partial_bytes_) {
  o.fd_ = -1;
}

BatchOutput::~BatchOutput() {
  if (fd_ >= 0) ::close(fd_);
}

Status BatchOutput::append(int64_t line, const std::string& record) {
  CHECK(!record.empty() && record.back() == '\n') << "a batch record is one '\\n'-terminated line";
  CHECK(!done(line)) << "input line " << line << " written twice";
  SNAP_RETURN_IF_ERROR(write_all(fd_, record, path_));
  if (::fdatasync(fd_) != 0) return data_loss(path_ + ": fdatasync failed: " + errno_text());
  done_.insert(line);
  return Status();
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return not_found(tmp + ": cannot create: " + errno_text());
  Status st = write_all(fd, text, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = data_loss(tmp + ": fsync failed: " + errno_text());
  ::close(fd);
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = data_loss(path + ": rename failed: " + errno_text());
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // the rename itself survives a crash
    ::close(dfd);
  }
  return Status();
}

// --- merge ---------------------------------------------------------------------------

Result<BatchMergeReport> merge_batch_outputs(const std::string& input, const std::string& output, int shards) {
  if (shards < 2) return invalid_argument("--shards must be at least 2 (a single shard already writes " + output + ")");
  // Each input line's custom_id ("" for a blank line, "\x01" for a line without one).
  std::vector<std::string> ids;
  {
    std::ifstream in(input, std::ios::binary);
    if (!in) return not_found(input + ": cannot read the batch input");
    std::string text;
    while (std::getline(in, text)) {
      if (batch_line_is_blank(text)) {
        ids.emplace_back();
        continue;
      }
      const BatchInput b = parse_batch_line(static_cast<int64_t>(ids.size()) + 1, text);
      ids.push_back(b.custom_id.empty() ? std::string("\x01") : b.custom_id);
    }
  }
  const int64_t lines = static_cast<int64_t>(ids.size());
  std::vector<std::string> records(ids.size());
  std::vector<int64_t> duplicated, foreign, wrong_id, wrong_shard;
  BatchMergeReport report;
  for (int s = 0; s < shards; ++s) {
    const ShardSpec shard{s, shards};
    const std::string path = shard_output_path(output, shard);
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found(path + ": shard " + shard.name() + "'s output is missing (did its task run?)");
    std::string text;
    int64_t row = 0;
    while (std::getline(in, text)) {
      ++row;
      if (in.eof()) {
        return data_loss(path + ": the last line is partial (shard " + shard.name() +
                         " was stopped mid-write; run it again to finish it)");
      }
      json j;
      try {
        j = json::parse(text);
      } catch (const json::exception&) {
        return data_loss(path + ": output line " + std::to_string(row) + " is not JSON");
      }
      if (!j.is_object() || !j.contains("line") || !j["line"].is_number_integer()) {
        return data_loss(path + ": output line " + std::to_string(row) + " is not a snapserve batch record");
      }
      const int64_t line = j["line"].get<int64_t>();
      if (line < 1 || line > lines || ids[line - 1].empty()) {
        foreign.push_back(line);
        continue;
      }
      if (!shard.owns(line)) wrong_shard.push_back(line);
      const std::string& want = ids[line - 1];
      const bool id_ok = want == "\x01" ? j["custom_id"].is_null()
                                        : j["custom_id"].is_string() && j["custom_id"].get<std::string>() == want;
      if (!id_ok) wrong_id.push_back(line);
      if (!records[line - 1].empty()) {
        duplicated.push_back(line);
        continue;
      }
      if (!j["error"].is_null()) ++report.errors;
      records[line - 1] = text + "\n";
    }
  }
  std::vector<int64_t> missing;
  for (int64_t k = 1; k <= lines; ++k) {
    if (ids[k - 1].empty()) continue;
    ++report.input_records;
    if (records[k - 1].empty()) missing.push_back(k);
  }
  std::string problems;
  auto add = [&](const std::vector<int64_t>& v, const std::string& what) {
    if (!v.empty()) problems += (problems.empty() ? "" : "; ") + what + " " + some_lines(v);
  };
  add(missing, "no result for input lines");
  add(duplicated, "more than one result for input lines");
  add(foreign, "results for lines that are not records of " + input + ":");
  add(wrong_id, "custom_id differs from the input on lines");
  add(wrong_shard, "results in the wrong shard's file for lines");
  if (!problems.empty()) return data_loss("merge of " + output + ": " + problems);

  std::string merged;
  for (const std::string& r : records) merged += r;
  SNAP_RETURN_IF_ERROR(write_file_atomic(output, merged));
  return report;
}

}  // namespace snap
