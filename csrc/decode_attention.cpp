// Attention of one new query per row over that row's own cached columns, for petting's
// decode step on CPU in float32.
//
// libtorch's CPU flash kernel, given the decode step's mask, runs one small matrix-vector
// product per (row, query head) over every column up to the longest row, and reads each
// key head once per query head it serves. Here each (row, key head) reads its keys and
// values once, for all the query heads it serves, and only its own columns; the softmax
// between the two passes is libtorch's own.
//
// Errors as csrc/ffi.h says.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>

#include "ffi.h"

namespace {

// On x86-64, each (row, key head) runs in a function compiled for AVX-512, for AVX2 and
// for neither, picked at load time by the CPU; the inner products inline into it.
#if defined(__x86_64__)
#define PETTING_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PETTING_SIMD_CLONES
#endif

// Sixteen independent partial sums, so the compiler vectorises without reordering a sum.
constexpr int kLanes = 16;

inline __attribute__((always_inline)) float dot(const float* a, const float* b, int64_t d) {
    float lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= d; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) lanes[j] += a[i + j] * b[i + j];
    }
    float sum = 0.0f;
    for (int j = 0; j < kLanes; ++j) sum += lanes[j];
    for (; i < d; ++i) sum += a[i] * b[i];
    return sum;
}

// The scores of `group` query heads (q: group × d) against keys 0..len (each `stride`
// apart): scores[g · span + s]; columns len..span get −inf.
PETTING_SIMD_CLONES
void score(const float* q, const float* keys, int64_t stride, int64_t len, float* scores, int64_t span,
           int64_t group, int64_t d, float scale) {
    for (int64_t s = 0; s < len; ++s) {
        const float* k = keys + s * stride;
        for (int64_t g = 0; g < group; ++g) scores[g * span + s] = dot(q + g * d, k, d) * scale;
    }
    for (int64_t g = 0; g < group; ++g) {
        std::fill(scores + g * span + len, scores + (g + 1) * span, -std::numeric_limits<float>::infinity());
    }
}

// out[g] (group × d, zeroed) += probs[g · span + s] · values[s] for s in 0..len.
PETTING_SIMD_CLONES
void weigh(const float* probs, const float* values, int64_t stride, int64_t len, float* out, int64_t span,
           int64_t group, int64_t d) {
    for (int64_t s = 0; s < len; ++s) {
        const float* v = values + s * stride;
        for (int64_t g = 0; g < group; ++g) {
            const float p = probs[g * span + s];
            float* o = out + g * d;
            for (int64_t i = 0; i < d; ++i) o[i] += p * v[i];
        }
    }
}

struct Strides {
    int64_t row, head, column;
};

Strides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

}  // namespace

extern "C" {

// q (n, H, 1, D); keys and values (n, K, S, D) with unit stride in D (views of the
// cache); last (n,) int64, row i attending to its columns 0..=last[i]; out (n, H, 1, D).
char* petting_decode_attention(const at::Tensor* q_in, const at::Tensor* keys, const at::Tensor* values,
                               const at::Tensor* last_in, double scale, at::Tensor** out) {
    return petting::guarded([&] {
        const at::Tensor q = q_in->contiguous();
        const at::Tensor lengths = (*last_in + 1).contiguous();
        const int64_t n = q.size(0), heads = q.size(1), d = q.size(3);
        const int64_t kv_heads = keys->size(1), span = keys->size(2);
        TORCH_CHECK(q.scalar_type() == at::kFloat && keys->scalar_type() == at::kFloat &&
                        values->scalar_type() == at::kFloat,
                    "decode attention takes float32");
        TORCH_CHECK(q.size(2) == 1 && heads % kv_heads == 0 && keys->size(0) == n && values->sizes() == keys->sizes(),
                    "decode attention: q ", q.sizes(), " against keys ", keys->sizes(), " and values ",
                    values->sizes());
        TORCH_CHECK(keys->stride(3) == 1 && values->stride(3) == 1, "decode attention: D must be contiguous");
        const int64_t group = heads / kv_heads;
        const int64_t* length = lengths.data_ptr<int64_t>();
        for (int64_t i = 0; i < n; ++i) {
            TORCH_CHECK(length[i] >= 1 && length[i] <= span, "decode attention: row ", i, " attends to ",
                        length[i], " of ", span, " columns");
        }
        const float* qp = q.data_ptr<float>();
        const float* kp = keys->data_ptr<float>();
        const float* vp = values->data_ptr<float>();
        const Strides ks = strides_of(*keys), vs = strides_of(*values);
        const float scale_f = static_cast<float>(scale);

        // 1. Scores (n, H, S), −inf past each row's length.
        at::Tensor scores = at::empty({n, heads, span}, q.options());
        float* sp = scores.data_ptr<float>();
        at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
            for (int64_t unit = begin; unit < end; ++unit) {
                const int64_t row = unit / kv_heads, kv = unit % kv_heads, first = row * heads + kv * group;
                score(qp + first * d, kp + row * ks.row + kv * ks.head, ks.column, length[row], sp + first * span,
                      span, group, d, scale_f);
            }
        });
        // 2. libtorch's softmax over the columns.
        const at::Tensor probs = at::softmax(scores, -1);
        const float* pp = probs.data_ptr<float>();
        // 3. Each query head's weighted sum of its row's values.
        at::Tensor result = at::zeros({n, heads, 1, d}, q.options());
        float* op = result.data_ptr<float>();
        at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
            for (int64_t unit = begin; unit < end; ++unit) {
                const int64_t row = unit / kv_heads, kv = unit % kv_heads, first = row * heads + kv * group;
                weigh(pp + first * span, vp + row * vs.row + kv * vs.head, vs.column, length[row], op + first * d,
                      span, group, d);
            }
        });
        *out = new at::Tensor(std::move(result));
    });
}

}  // extern "C"
