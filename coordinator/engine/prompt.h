// From user text to prompt token ids: plain text gets the tokenizer's special tokens
// (BOS if the model wants one); chat text goes through the model's chat template, whose
// output already spells its special tokens, and gets BOS only if the template left it out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace snap {

std::vector<int32_t> prompt_ids_for_text(const Tokenizer& tok, const std::string& text);
Result<std::vector<int32_t>> prompt_ids_for_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages);

}  // namespace snap
