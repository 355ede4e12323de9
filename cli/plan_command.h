// `kappa plan CONFIG [key=value ...] [--json]`: before anything starts, the
// memory each process of `kappa run CONFIG ...` will need, term by term
// (cli/memory_plan.h), the device each term is charged to, the weight-sync
// bytes per policy version, the largest messages against
// security.max_message_bytes, and whether each device fits. The same config
// and overrides as `kappa run`.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/memory_plan.h"
#include "services/config.h"

namespace kappa::cli {

// The plan's inputs for `config`: each model's shape (config.json of its
// checkpoint; with an empty checkpoint the cached bootstrap's, else the
// configured student/teacher.shape with the character tokenizer's
// vocabulary), the longest rendered prompt of the train and held-out splits
// (or plan.prompt_tokens), the dtypes each process resolves and the teacher
// rows the loss asks for. Reads config.json files, the task's data and the
// student's tokenizer; loads no weights. INVALID_ARGUMENT naming the key
// when student.lora is out of range (learner/student_lora.h, the learner's
// own check); FAILED_PRECONDITION naming the key when a configured
// checkpoint holds none; the dataset's or tokenizer's error otherwise.
absl::StatusOr<PlanInputs> PlanInputsFor(const services::Config& config);

// Capacity of every device the plan charges: "host" from plan.host_memory_bytes,
// else MemAvailable (/proc/meminfo), or the cgroup's limit less its usage
// when that is lower; "cuda:N" from plan.device_memory_bytes, else the GPU's
// free memory (CUDA builds only; absent otherwise, so unchecked).
std::map<std::string, int64_t> DetectCapacity(const services::Config& config,
                                              const MemoryPlan& plan);

// `kappa run`'s check, the last of its preflight: OK when the plan fits, or
// when its inputs cannot be read (the run's own checks name the missing
// checkpoint or data); FAILED_PRECONDITION from CheckPlanFits otherwise.
absl::Status CheckRunPlan(const services::Config& config);

// args: everything after "plan". The plan on `out` (a table, or one JSON
// object with --json). Returns 0 when it fits, 1 when it does not or
// cannot be made (the reason on `err`), 2 on a usage error.
int PlanCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kappa::cli
