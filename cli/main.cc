// kappa: the command-line entry point.
//   kappa sft CONFIG [key=value ...] --role teacher|student [--out DIR]
//   kappa run CONFIG [key=value ...] [--resume] [--no-progress] [--ignore-plan]
//   kappa plan CONFIG [key=value ...] [--json]
//   kappa experiment ABLATION.yaml [key=value ...] [--quick] [--out DIR]
//   kappa report RUN_DIR [--out FILE]
//   kappa logits MODEL_DIR --ids 1,5,9
//   kappa generate MODEL_DIR --prompt-ids 1,5,9 [--max-new-tokens N ...]
//   kappa export --merge ADAPTER_DIR OUT_DIR [--base BASE_DIR]
//   kappa tokenize MODEL_DIR [--add-special-tokens] < strings.jsonl
//   kappa detokenize MODEL_DIR [--skip-special-tokens] < ids.jsonl
//   kappa render-prompt MODEL_DIR [--no-generation-prompt] [--context JSON] < messages.jsonl
//   kappa grade --reward math|math_strict|exact < lines.jsonl
//   kappa config-reference > docs/configuration.md
#include <iostream>
#include <string>
#include <vector>

#include "cli/config_reference_command.h"
#include "cli/experiment_command.h"
#include "cli/grade_command.h"
#include "cli/model_commands.h"
#include "cli/plan_command.h"
#include "cli/prompt_commands.h"
#include "cli/report_command.h"
#include "cli/run_command.h"
#include "cli/sft_command.h"
#include "cli/tokenizer_commands.h"

namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  kappa run CONFIG [key=value ...] [--resume] [--no-progress] [--ignore-plan]\n"
    "      bootstrap teacher/student by SFT (cached), start teacher, verifier, learner and\n"
    "      rollout workers, show training progress, stop everything when done; refuses a\n"
    "      run whose memory plan does not fit (--ignore-plan starts it anyway)\n"
    "  kappa plan CONFIG [key=value ...] [--json]\n"
    "      the memory each process of that run will need, term by term, on which device,\n"
    "      the weight-sync bytes per version, the largest messages, and whether it fits\n"
    "  kappa sft CONFIG [key=value ...] --role teacher|student [--out DIR]\n"
    "      supervised warm start of one model; writes a checkpoint and sft_summary.json\n"
    "  kappa experiment ABLATION.yaml [key=value ...] [--quick] [--out DIR]\n"
    "      one `kappa run` per (arm, seed) of an ablation file, then results.csv and\n"
    "      results.md (per arm: mean ± std over seeds) and report.html (curves per arm) in DIR\n"
    "  kappa report RUN_DIR [--out FILE]\n"
    "      a self-contained HTML page of a run (curves, alarms, K_DR heatmap, summary,\n"
    "      config) from RUN_DIR/metrics.jsonl; default RUN_DIR/report.html\n"
    "  kappa logits MODEL_DIR --ids 1,5,9 [--device D] [--dtype T]\n"
    "      one forward of a Hugging Face model directory: the logits of each position\n"
    "  kappa generate MODEL_DIR --prompt-ids 1,5,9 [--max-new-tokens N] [--temperature T] ...\n"
    "      a sample from the model, ending at its stop ids or N tokens\n"
    "  kappa export --merge ADAPTER_DIR OUT_DIR [--base BASE_DIR]\n"
    "      a PEFT LoRA adapter merged into its base (BASE_DIR, else the adapter's\n"
    "      base_model_name_or_path), written as a plain Hugging Face model directory\n"
    "  kappa tokenize MODEL_DIR [--add-special-tokens] < strings.jsonl\n"
    "      the model's tokenizer.json: one JSON array of ids per JSON string on stdin\n"
    "  kappa detokenize MODEL_DIR [--skip-special-tokens] < ids.jsonl\n"
    "      the reverse: one JSON string per JSON array of ids on stdin\n"
    "  kappa render-prompt MODEL_DIR [--no-generation-prompt] [--context JSON] < messages.jsonl\n"
    "      the model's chat template: one rendered prompt per JSON list of messages on stdin\n"
    "  kappa grade --reward math|math_strict|exact < lines.jsonl\n"
    "      the verifier's reward, 1 or 0, per {\"response\": ..., \"answer\": ...} line on\n"
    "      stdin (docs/grading.md)\n"
    "  kappa config-reference\n"
    "      every configuration key with its type, default and description, as Markdown\n"
    "      (docs/configuration.md is its output)\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "run") return kappa::cli::RunCommand(args);
  if (command == "plan") return kappa::cli::PlanCommand(args, std::cout, std::cerr);
  if (command == "sft") return kappa::cli::SftCommand(args);
  if (command == "experiment") return kappa::cli::ExperimentCommand(args);
  if (command == "report") return kappa::cli::ReportCommand(args);
  if (command == "logits") return kappa::cli::LogitsCommand(args);
  if (command == "generate") return kappa::cli::GenerateCommand(args);
  if (command == "export") return kappa::cli::ExportCommand(args);
  if (command == "tokenize") return kappa::cli::TokenizeCommand(args, std::cin, std::cout);
  if (command == "detokenize") return kappa::cli::DetokenizeCommand(args, std::cin, std::cout);
  if (command == "render-prompt") return kappa::cli::RenderPromptCommand(args, std::cin, std::cout);
  if (command == "grade") return kappa::cli::GradeCommand(args, std::cin, std::cout);
  if (command == "config-reference") return kappa::cli::ConfigReferenceCommand(args, std::cout);
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << kUsage;
    return 0;
  }
  std::cerr << "kappa: unknown command '" << command << "'\n" << kUsage;
  return 2;
}
