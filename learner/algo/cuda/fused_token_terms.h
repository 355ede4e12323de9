/* Launchers of the fused token-terms kernels (fused_token_terms.cu): the
 * forward and backward of learner/algo/fused_token_terms.h on raw device
 * pointers. Plain C so the .cu needs no ATen and the wrapper no CUDA
 * compiler. All tensors are dense row-major [rows, vocab] / [rows] on the
 * current device; one thread block per row. Both return the launch status
 * (cudaGetLastError); rows == 0 launches nothing. */
#ifndef KAPPA_LEARNER_ALGO_CUDA_FUSED_TOKEN_TERMS_H_
#define KAPPA_LEARNER_ALGO_CUDA_FUSED_TOKEN_TERMS_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  KAPPA_LOGITS_FLOAT32 = 0,
  KAPPA_LOGITS_BFLOAT16 = 1,
} kappa_logits_dtype;

/* logits: [rows, vocab] of `dtype`; targets: [rows] ids (an id outside
 * [0, vocab) gives a NaN token log-prob); teacher_logprobs: [rows, vocab]
 * log q. Writes logprobs [rows, vocab] = log_softmax(logits / temperature)
 * in float32 and, per row, token_logprobs = log p(y), reverse_kl =
 * Σ p (log p − log q) and entropy = −Σ p log p. */
cudaError_t kappa_fused_token_terms_forward(const void* logits, kappa_logits_dtype dtype,
                                            const int64_t* targets,
                                            const float* teacher_logprobs, int64_t rows,
                                            int64_t vocab, float temperature, float* logprobs,
                                            float* token_logprobs, float* reverse_kl,
                                            float* entropy, cudaStream_t stream);

/* grad_logits [rows, vocab] of `dtype` =
 *   (g_tok (onehot(y) − p) + g_kl p (log p − log q − KL)) / temperature
 * from the forward's logprobs and reverse_kl. grad_token / grad_kl ([rows])
 * may be NULL (that gradient absent); a row whose coefficient is 0 skips
 * that term (so padding rows read no teacher row). */
cudaError_t kappa_fused_token_terms_backward(const float* logprobs,
                                             const float* teacher_logprobs,
                                             const int64_t* targets, const float* reverse_kl,
                                             const float* grad_token, const float* grad_kl,
                                             int64_t rows, int64_t vocab, float temperature,
                                             void* grad_logits, kappa_logits_dtype dtype,
                                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* KAPPA_LEARNER_ALGO_CUDA_FUSED_TOKEN_TERMS_H_ */
