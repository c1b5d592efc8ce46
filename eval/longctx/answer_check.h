// Exact scorers for the long-context tasks: an output against the expected answers.
// `contains`: some expected answer occurs as a whole token (digits not inside a longer
// number, words not inside a longer word; words case-insensitive); `exact`: the output,
// trimmed of spaces and final punctuation, equals the answer; `numeric`: the first integer
// in the output equals the answer; `all`: every expected answer is contained (partial
// credit = the share found, accuracy counts only all of them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace snap::eval {

enum class ScoreKind : uint8_t { contains, exact, numeric, all };
const char* score_kind_name(ScoreKind k);
Result<ScoreKind> score_kind_from_name(const std::string& name);

struct AnswerScore {
  bool correct = false;
  double partial = 0.0;  // share of expected answers found (all); 0 or 1 otherwise
};

// Whether `answer` occurs in `text` with no letter/digit glued to either side of it.
bool contains_whole(const std::string& text, const std::string& answer);

AnswerScore score_answer(ScoreKind kind, const std::string& output, const std::vector<std::string>& expected);

}  // namespace snap::eval
