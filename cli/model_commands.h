// Looking inside a checkpoint before spending GPU hours on it:
//   kappa logits MODEL_DIR --ids 1,5,9 [--device D] [--dtype float32|bfloat16|auto]
//       one JSON object {"ids": [...], "logits": [[V floats] per position]}:
//       fp32 full rows of a plain forward of those ids (no sampling).
//   kappa generate MODEL_DIR (--prompt-ids 1,5,9 | --prompt TEXT)
//       [--max-new-tokens N] [--temperature T] [--top-p P] [--seed S]
//       [--device D] [--dtype ...]
//       one JSON object {"prompt_ids", "ids", "logprobs", "finished"} (and
//       "text", the response decoded without special tokens, with --prompt):
//       a sample with the KV cache, ending at any stop id of
//       generation_config.json (else config.json) or after N tokens
//       ("finished": false). --prompt TEXT is encoded with MODEL_DIR's
//       tokenizer.json as a raw prompt (special tokens added); padded
//       embedding rows are then never sampled.
//   kappa export --merge ADAPTER_DIR OUT_DIR [--base BASE_DIR]
//       a PEFT LoRA adapter directory merged into its base (BASE_DIR, else
//       the adapter's base_model_name_or_path, a local directory): OUT_DIR
//       is a plain Hugging Face model directory (W + scaling · B · A per
//       adapted projection) in the base's dtype, with the base's tokenizer
//       files; a line on stderr says what was written.
// MODEL_DIR is a Hugging Face model directory (or a kappa checkpoint).
// Exit status: 0 done, 1 the model could not be loaded or run (the message
// names the file and field or tensor), 2 bad arguments (naming the flag).
#pragma once

#include <string>
#include <vector>

namespace kappa::cli {

int LogitsCommand(const std::vector<std::string>& args);
int GenerateCommand(const std::vector<std::string>& args);
int ExportCommand(const std::vector<std::string>& args);

}  // namespace kappa::cli
