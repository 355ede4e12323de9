// Forward and backward of the fused token terms (see fused_token_terms.h
// here and learner/algo/fused_token_terms.h). Pure CUDA C++: raw pointers,
// sizes and a stream; the ATen wrapper lives in the .cc.
//
// Forward, one block per position row:
//   pass 1: online max / sum-exp of x = z / τ over the row (each thread a
//           strided slice, then a block merge of (max, sum) pairs);
//   pass 2: log p = x − lse written in float32, and Σ p (log p − log q),
//           −Σ p log p block-reduced; log p(y) from the same expression.
// Backward, one block per row: the closed form, written in the logits' dtype.
#include "learner/algo/cuda/fused_token_terms.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16(v);
}

// A running (max, Σ exp(x − max)) pair; max = −inf means "no element yet".
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum Merge(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ MaxSum WarpMerge(MaxSum v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other{__shfl_xor_sync(kFullMask, v.max, offset),
                       __shfl_xor_sync(kFullMask, v.sum, offset)};
    v = Merge(v, other);
  }
  return v;
}

// Every thread gets the merge over the block.
__device__ MaxSum BlockMerge(MaxSum v) {
  __shared__ MaxSum warp_result[kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpMerge(v);
  if (lane == 0) warp_result[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? warp_result[lane] : MaxSum{-INFINITY, 0.f};
    v = WarpMerge(v);
    if (lane == 0) warp_result[0] = v;
  }
  __syncthreads();
  return warp_result[0];
}

__device__ __forceinline__ float2 WarpSum(float2 v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v.x += __shfl_xor_sync(kFullMask, v.x, offset);
    v.y += __shfl_xor_sync(kFullMask, v.y, offset);
  }
  return v;
}

// The block sum, valid in thread 0.
__device__ float2 BlockSum(float2 v) {
  __shared__ float2 warp_result[kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) warp_result[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? warp_result[lane] : make_float2(0.f, 0.f);
    v = WarpSum(v);
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                  const float* __restrict__ teacher, int64_t vocab, float temperature,
                  float* __restrict__ logprobs, float* __restrict__ token_logprobs,
                  float* __restrict__ reverse_kl, float* __restrict__ entropy) {
  const int64_t row = blockIdx.x;
  const T* z = logits + row * vocab;
  const float* q = teacher + row * vocab;
  float* lp_out = logprobs + row * vocab;

  MaxSum ms{-INFINITY, 0.f};
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float x = Load(z, v) / temperature;
    if (x > ms.max) {
      ms.sum = ms.sum * expf(ms.max - x) + 1.f;
      ms.max = x;
    } else if (ms.max != -INFINITY) {
      ms.sum += expf(x - ms.max);  // NaN x propagates through the sum
    }
  }
  ms = BlockMerge(ms);
  const float lse = ms.max + logf(ms.sum);

  float2 acc = make_float2(0.f, 0.f);  // (Σ p (log p − log q), −Σ p log p)
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float lp = Load(z, v) / temperature - lse;
    lp_out[v] = lp;
    const float p = expf(lp);
    if (p != 0.f) {  // p = 0 contributes 0 (not 0 · −inf); NaN passes
      acc.x += p * (lp - q[v]);
      acc.y -= p * lp;
    }
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) {
    const int64_t y = targets[row];
    token_logprobs[row] = (y >= 0 && y < vocab) ? Load(z, y) / temperature - lse : NAN;
    reverse_kl[row] = acc.x;
    entropy[row] = acc.y;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    BackwardKernel(const float* __restrict__ logprobs, const float* __restrict__ teacher,
                   const int64_t* __restrict__ targets, const float* __restrict__ reverse_kl,
                   const float* __restrict__ grad_token, const float* __restrict__ grad_kl,
                   int64_t vocab, float temperature, T* __restrict__ grad_logits) {
  const int64_t row = blockIdx.x;
  const float g_tok = grad_token != nullptr ? grad_token[row] : 0.f;
  const float g_kl = grad_kl != nullptr ? grad_kl[row] : 0.f;
  const float kl = g_kl != 0.f ? reverse_kl[row] : 0.f;
  const int64_t y = targets[row];
  const float* lp_row = logprobs + row * vocab;
  const float* q = teacher + row * vocab;
  T* out = grad_logits + row * vocab;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float lp = lp_row[v];
    const float p = expf(lp);
    float g = 0.f;
    if (g_kl != 0.f && p != 0.f) g = g_kl * p * (lp - q[v] - kl);
    if (g_tok != 0.f) g += g_tok * ((v == y ? 1.f : 0.f) - p);
    Store(out, v, g / temperature);
  }
}

bool BadShape(int64_t rows, int64_t vocab) {
  return rows < 0 || rows > INT_MAX || vocab <= 0;
}

}  // namespace

extern "C" cudaError_t kappa_fused_token_terms_forward(
    const void* logits, kappa_logits_dtype dtype, const int64_t* targets,
    const float* teacher_logprobs, int64_t rows, int64_t vocab, float temperature,
    float* logprobs, float* token_logprobs, float* reverse_kl, float* entropy,
    cudaStream_t stream) {
  if (BadShape(rows, vocab) || !(temperature > 0.f)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(rows));
  switch (dtype) {
    case KAPPA_LOGITS_FLOAT32:
      ForwardKernel<float><<<grid, kThreads, 0, stream>>>(
          static_cast<const float*>(logits), targets, teacher_logprobs, vocab, temperature,
          logprobs, token_logprobs, reverse_kl, entropy);
      break;
    case KAPPA_LOGITS_BFLOAT16:
      ForwardKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(logits), targets, teacher_logprobs, vocab,
          temperature, logprobs, token_logprobs, reverse_kl, entropy);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t kappa_fused_token_terms_backward(
    const float* logprobs, const float* teacher_logprobs, const int64_t* targets,
    const float* reverse_kl, const float* grad_token, const float* grad_kl, int64_t rows,
    int64_t vocab, float temperature, void* grad_logits, kappa_logits_dtype dtype,
    cudaStream_t stream) {
  if (BadShape(rows, vocab) || !(temperature > 0.f)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(rows));
  switch (dtype) {
    case KAPPA_LOGITS_FLOAT32:
      BackwardKernel<float><<<grid, kThreads, 0, stream>>>(
          logprobs, teacher_logprobs, targets, reverse_kl, grad_token, grad_kl, vocab,
          temperature, static_cast<float*>(grad_logits));
      break;
    case KAPPA_LOGITS_BFLOAT16:
      BackwardKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          logprobs, teacher_logprobs, targets, reverse_kl, grad_token, grad_kl, vocab,
          temperature, static_cast<__nv_bfloat16*>(grad_logits));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
