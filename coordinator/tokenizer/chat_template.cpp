// Chat template rendering by family (see chat_template.h). The ChatML default system
// message is read from the template source itself, so SmolLM2's ("You are a helpful AI
// assistant named SmolLM, trained by Hugging Face") and Qwen2's ("You are a helpful
// assistant.") both come out exactly as their Jinja templates would render them.
#include "coordinator/tokenizer/chat_template.h"

namespace snap {

namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// The system message a ChatML template inserts when the conversation has none: the text of
// '<|im_start|>system\n...<|im_end|>' in a template that tests for a missing system role.
std::string chatml_default_system(const std::string& src) {
  if (src.find("!= 'system'") == std::string::npos && src.find("!= \"system\"") == std::string::npos) return "";
  const std::string open = "<|im_start|>system";
  size_t p = src.find(open);
  if (p == std::string::npos) return "";
  p += open.size();
  if (src.compare(p, 1, "\n") == 0) {
    p += 1;
  } else if (src.compare(p, 2, "\\n") == 0) {
    p += 2;
  } else {
    return "";
  }
  size_t e = src.find("<|im_end|>", p);
  if (e == std::string::npos) return "";
  std::string text = src.substr(p, e - p);
  if (text.find_first_of("'\"{}") != std::string::npos) return "";  // not a plain literal
  return text;
}

std::string token_or(const Tokenizer& tok, int32_t id) { return id >= 0 ? tok.token_text(id) : std::string(); }

Status check_alternation(const std::vector<ChatMessage>& msgs, size_t first) {
  for (size_t i = first; i < msgs.size(); ++i) {
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (msgs[i].role != want) {
      return invalid_argument("chat template: conversation roles must alternate user/assistant (message " +
                              std::to_string(i) + " has role '" + msgs[i].role + "')");
    }
  }
  return Status();
}

}  // namespace

ChatFamily chat_family(const std::string& src) {
  if (src.find("<|start_header_id|>") != std::string::npos) return ChatFamily::llama3;
  if (src.find("<start_of_turn>") != std::string::npos) return ChatFamily::gemma;
  if (src.find("[INST]") != std::string::npos) {
    return src.find("<<SYS>>") != std::string::npos ? ChatFamily::llama2 : ChatFamily::mistral;
  }
  return ChatFamily::chatml;  // "<|im_start|>" templates, and the fallback for unknown ones
}

Result<std::string> apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) {
  const std::string& src = tokenizer.chat_template_source();
  const std::string bos = token_or(tokenizer, tokenizer.bos_id());
  const std::string eos = token_or(tokenizer, tokenizer.eos_id());
  std::string out;
  ChatFamily family = chat_family(src);
  if (src.empty() && tokenizer.token_id("<start_of_turn>") >= 0) family = ChatFamily::gemma;
  switch (family) {
    case ChatFamily::chatml: {
      std::string sys = chatml_default_system(src);
      if (!sys.empty() && (messages.empty() || messages[0].role != "system")) {
        out += "<|im_start|>system\n" + sys + "<|im_end|>\n";
      }
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    }
    case ChatFamily::llama3: {
      if (src.find("bos_token") != std::string::npos) out += bos;
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatFamily::mistral: {
      // A leading system message is folded into the first user turn (Mistral v0.1's own
      // template rejects system messages).
      size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
      SNAP_RETURN_IF_ERROR(check_alternation(messages, first));
      out += bos;
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role == "user") {
          std::string content = (first == 1 && i == 1) ? messages[0].content + "\n\n" + m.content : m.content;
          out += "[INST] " + content + " [/INST]";
        } else {
          out += m.content + eos;
        }
      }
      break;
    }
    case ChatFamily::llama2: {
      size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
      SNAP_RETURN_IF_ERROR(check_alternation(messages, first));
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        std::string content = m.content;
        if (first == 1 && i == 1) content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content;
        if (m.role == "user") {
          out += bos + "[INST] " + trim(content) + " [/INST]";
        } else {
          out += " " + trim(content) + " " + eos;
        }
      }
      break;
    }
    case ChatFamily::gemma: {
      // Gemma 3's template: a system message becomes a prefix of the first user turn, the
      // assistant's role is "model", contents are trimmed, every turn ends "<end_of_turn>\n".
      size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
      SNAP_RETURN_IF_ERROR(check_alternation(messages, first));
      out += bos;
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        const std::string prefix = (first == 1 && i == 1) ? trim(messages[0].content) + "\n\n" : "";
        out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n" + prefix +
               trim(m.content) + "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
  }
  return out;
}

}  // namespace snap
