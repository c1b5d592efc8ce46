// Long-context task generators (RULER-style, our own): single needle and passkey at a
// depth, multi-key needle among distractor keys, multi-value (all values of one key),
// variable tracking (a chain X1 = 12345, X2 = X1, ...) and common-word aggregation. A task
// is a pure function of its TaskSpec (kind, haystack, token length, depth, seed) and the
// tokenizer: the haystack is cut so that the whole prompt, as the model will see it, has at
// most `length` tokens and as many as fit. The prompt is always context + "\n\n" +
// question (exactly what `generate --prompt-file CONTEXT --question Q` builds), so the two
// question placements differ only in where compression runs, never in the tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "eval/longctx/answer_check.h"
#include "eval/longctx/haystack.h"

namespace snap::eval {

enum class TaskKind : uint8_t { niah_single, passkey, niah_multikey, niah_multivalue, vt, cwe };
const char* task_name(TaskKind k);
Result<TaskKind> task_from_name(const std::string& name);
// Whether the task places its (first) needle at the spec's depth; the others ignore depth.
bool task_uses_depth(TaskKind k);
bool task_uses_haystack(TaskKind k);  // cwe is a word list, no haystack
int64_t task_default_max_tokens(TaskKind k);

// Where the question sits relative to compression: `after` compresses the whole prompt
// (the observation window sees the question, SnapKV's own setting); `context_only`
// compresses the context, then prefills the question on the compressed cache.
enum class Placement : uint8_t { after, context_only };
const char* placement_name(Placement p);
Result<Placement> placement_from_name(const std::string& name);

struct TaskSpec {
  TaskKind kind = TaskKind::niah_single;
  HaystackKind haystack = HaystackKind::shakespeare;
  int64_t length = 1024;   // prompt tokens at most (chat template and question included)
  int depth_percent = 50;  // 0..100, -1 for tasks that do not use it
  uint64_t seed = 0;
  // A tighter bound than `length` for the fitted prompt, 0 for none: `eval run` sets it to
  // the model's context less the answer's new tokens, so that a case at the model's whole
  // context (SmolLM2 at 8192) leaves room for its answer. Only the fit reads it: the seed,
  // needles and haystack cut stay those of `length`.
  int64_t max_prompt_tokens = 0;
};

// The most prompt tokens a spec's prompt may have: length, or max_prompt_tokens if smaller.
int64_t prompt_token_bound(const TaskSpec& spec);

struct EvalTask {
  TaskSpec spec;
  std::string context;              // instruction + haystack with the needles
  std::string question;
  std::vector<std::string> needles; // the inserted sentences, in text order
  std::vector<std::string> expected;
  ScoreKind scorer = ScoreKind::contains;
  // The prompt as sent: the chat user message (chat) or the whole completion prompt.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;  // as the in-process engine runs it
  int64_t context_tokens = 0;       // prompt tokens before the question (context_only cut)
  std::string prompt_sha256;        // of prompt_text
  // Each needle's prompt positions [begin, end) (token boundaries by longest common prefix:
  // a token spanning a needle's edge counts outside it), for checking what a policy kept.
  std::vector<std::pair<int64_t, int64_t>> needle_tokens;
};

// The prompt text for a context and question: "context\n\nquestion" (chat: the user
// message); completions append "\nAnswer:" so a base model answers.
std::string task_prompt_text(const std::string& context, const std::string& question, bool chat);
// Prompt ids for prompt_text (chat template or BOS + text) and the context token count,
// computed as `snapserve generate --question` does (longest common prefix with the ids of
// the context alone).
Status tokenize_task(const Tokenizer& tok, bool chat, EvalTask* task);
// Fills task->needle_tokens (after tokenize_task): where each needle's sentence lies in
// prompt_ids. Needles are found in text order; one missing from the text is an error.
Status locate_needle_tokens(const Tokenizer& tok, bool chat, EvalTask* task);

// Builds the task. corpus may be null for the noise haystack and cwe; a spec whose length
// cannot hold the task's fixed parts is an invalid_argument naming the length.
Result<EvalTask> make_task(const TaskSpec& spec, const Tokenizer& tok, const TextCorpus* corpus, bool chat);

}  // namespace snap::eval
