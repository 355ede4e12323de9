// Bytes on the wire per response token of a teacher Score response, for each
// form the learner's losses accept (docs/algorithms.md §2.2) and each value dtype, at
// real vocabulary sizes. The sizes are of real messages: log-softmax rows
// encoded by the one tensor codec into a ScoreResponse and measured with
// ByteSizeLong(), so field tags, length prefixes and the int32 top-k ids
// count. Deterministic (no timing).
// Usage: kappa_bench_teacher_payload [--tokens T] [--top-k K]
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "kappa/v1/teacher.pb.h"
#include "services/torch_tensor_codec.h"

namespace {

struct Form {
  const char* name;
  kappa::v1::ScoreForm form;
};

// One scored sequence of `logprobs` [T, V] in `form` at `dtype`.
kappa::v1::ScoreResponse Response(const torch::Tensor& logprobs, const torch::Tensor& sampled_ids,
                                  kappa::v1::ScoreForm form, int64_t top_k,
                                  kappa::v1::DType dtype) {
  kappa::v1::ScoreResponse response;
  response.set_vocab_size(static_cast<int32_t>(logprobs.size(1)));
  kappa::v1::ScoredSequence* sequence = response.add_sequences();
  switch (form) {
    case kappa::v1::SCORE_FORM_TOPK: {
      auto [values, ids] = logprobs.topk(top_k, /*dim=*/1);
      kappa::services::EncodeTensor(values, sequence->mutable_logprobs(), dtype);
      kappa::services::EncodeTensor(ids.to(torch::kInt32), sequence->mutable_topk_ids());
      // The float32 tail log q(T) the teacher sends beside them (teacher.proto).
      kappa::services::EncodeTensor(
          logprobs.scatter(1, ids, -std::numeric_limits<float>::infinity()).logsumexp(1),
          sequence->mutable_tail_logmass(), kappa::v1::DTYPE_FLOAT32);
      break;
    }
    case kappa::v1::SCORE_FORM_SAMPLED:
      kappa::services::EncodeTensor(logprobs.gather(1, sampled_ids.unsqueeze(1)).squeeze(1),
                                    sequence->mutable_logprobs(), dtype);
      break;
    default:
      kappa::services::EncodeTensor(logprobs, sequence->mutable_logprobs(), dtype);
  }
  return response;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 256, top_k = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (flag == "--top-k") top_k = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  torch::manual_seed(1);
  std::printf("%lld response tokens, top-k %lld; bytes per response token\n",
              static_cast<long long>(tokens), static_cast<long long>(top_k));
  std::printf("| vocab | form | dtype | bytes/token | × full fp32 |\n|---|---|---|---|---|\n");
  for (int64_t vocab : {32000, 151936}) {
    const torch::Tensor logprobs = torch::log_softmax(torch::randn({tokens, vocab}), 1);
    const torch::Tensor sampled_ids = torch::randint(vocab, {tokens}, torch::kLong);
    double full_fp32 = 0;
    for (const Form& form : {Form{"full", kappa::v1::SCORE_FORM_FULL},
                             Form{"topk", kappa::v1::SCORE_FORM_TOPK},
                             Form{"sampled", kappa::v1::SCORE_FORM_SAMPLED}}) {
      for (kappa::v1::DType dtype : {kappa::v1::DTYPE_FLOAT32, kappa::v1::DTYPE_BFLOAT16}) {
        const double per_token =
            static_cast<double>(
                Response(logprobs, sampled_ids, form.form, top_k, dtype).ByteSizeLong()) /
            static_cast<double>(tokens);
        if (full_fp32 == 0) full_fp32 = per_token;
        std::printf("| %lld | %s | %s | %.1f | %.2g |\n", static_cast<long long>(vocab),
                    form.name, dtype == kappa::v1::DTYPE_FLOAT32 ? "fp32" : "bf16", per_token,
                    per_token / full_fp32);
      }
    }
  }
  return 0;
}
