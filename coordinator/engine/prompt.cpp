// Prompt construction for plain and chat requests.
#include "coordinator/engine/prompt.h"

namespace snap {

std::vector<int32_t> prompt_ids_for_text(const Tokenizer& tok, const std::string& text) {
  return tok.encode(text, true);
}

Result<std::vector<int32_t>> prompt_ids_for_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages) {
  SNAP_ASSIGN_OR_RETURN(std::string text, apply_chat_template(tok, messages, true));
  std::vector<int32_t> ids = tok.encode(text, false);
  if (tok.add_bos() && tok.bos_id() >= 0 && (ids.empty() || ids.front() != tok.bos_id())) {
    ids.insert(ids.begin(), tok.bos_id());
  }
  return ids;
}

}  // namespace snap
