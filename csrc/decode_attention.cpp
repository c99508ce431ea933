// Attention of one new query per row over that row's own cached columns, for petting's
// decode step on CPU in float32.
//
// libtorch's CPU flash kernel, given the decode step's mask, runs one small matrix-vector
// product per (row, query head) over every column up to the longest row, and reads each
// key head once per query head it serves. Here each (row, key head) reads its keys and
// values once, for all the query heads it serves, and only its own columns; the softmax
// between the two passes is libtorch's own.
//
// Rows that hold copies of another slot's first columns (the K branches of one prompt)
// read those columns from that slot instead, and run one after the other: the copies are
// the same values, and the branches then find them in the core's cache rather than each
// fetching its own copy from memory. The decode step is bound by that memory traffic on
// long prompts.
//
// Errors as csrc/ffi.h says.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <vector>

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

// Where a (row, key head)'s columns are: 0..shared_len at `shared`, the rest at `own`,
// each column `stride` floats after the one before.
struct Columns {
    const float* shared;
    const float* own;
    int64_t shared_len, len, stride;

    const float* at(int64_t s) const { return (s < shared_len ? shared : own) + s * stride; }
};

// The scores of `group` query heads (q: group × d) against the keys: scores[g · span + s];
// columns len..span get −inf.
PETTING_SIMD_CLONES
void score(const float* q, const Columns& keys, float* scores, int64_t span, int64_t group, int64_t d, float scale) {
    for (int64_t s = 0; s < keys.len; ++s) {
        const float* k = keys.at(s);
        for (int64_t g = 0; g < group; ++g) scores[g * span + s] = dot(q + g * d, k, d) * scale;
    }
    for (int64_t g = 0; g < group; ++g) {
        std::fill(scores + g * span + keys.len, scores + (g + 1) * span, -std::numeric_limits<float>::infinity());
    }
}

// out[g] (group × d, zeroed) += probs[g · span + s] · values[s] over the row's columns.
PETTING_SIMD_CLONES
void weigh(const float* probs, const Columns& values, float* out, int64_t span, int64_t group, int64_t d) {
    for (int64_t s = 0; s < values.len; ++s) {
        const float* v = values.at(s);
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
// cache); last (n,) int64, row i attending to its columns 0..=last[i], of which the first
// shared_len[i] are read from row shared_slot[i] (both (n,) int64; a length of 0 reads
// none); out (n, H, 1, D).
char* petting_decode_attention(const at::Tensor* q_in, const at::Tensor* keys, const at::Tensor* values,
                               const at::Tensor* last_in, const at::Tensor* shared_slot_in,
                               const at::Tensor* shared_len_in, double scale, at::Tensor** out) {
    return petting::guarded([&] {
        const at::Tensor q = q_in->contiguous();
        const at::Tensor lengths = (*last_in + 1).contiguous();
        const at::Tensor shared_slots = shared_slot_in->contiguous(), shared_lens = shared_len_in->contiguous();
        const int64_t n = q.size(0), heads = q.size(1), d = q.size(3);
        const int64_t kv_heads = keys->size(1), span = keys->size(2);
        TORCH_CHECK(q.scalar_type() == at::kFloat && keys->scalar_type() == at::kFloat &&
                        values->scalar_type() == at::kFloat,
                    "decode attention takes float32");
        TORCH_CHECK(q.size(2) == 1 && heads % kv_heads == 0 && keys->size(0) == n && values->sizes() == keys->sizes(),
                    "decode attention: q ", q.sizes(), " against keys ", keys->sizes(), " and values ",
                    values->sizes());
        TORCH_CHECK(keys->stride(3) == 1 && values->stride(3) == 1, "decode attention: D must be contiguous");
        TORCH_CHECK(shared_slots.numel() == n && shared_lens.numel() == n, "decode attention: ", n,
                    " rows but shared columns for ", shared_slots.numel(), " and ", shared_lens.numel());
        const int64_t group = heads / kv_heads;
        const int64_t* length = lengths.data_ptr<int64_t>();
        const int64_t* shared_slot = shared_slots.data_ptr<int64_t>();
        const int64_t* shared_len = shared_lens.data_ptr<int64_t>();
        for (int64_t i = 0; i < n; ++i) {
            TORCH_CHECK(length[i] >= 1 && length[i] <= span, "decode attention: row ", i, " attends to ",
                        length[i], " of ", span, " columns");
            const int64_t from = shared_slot[i];
            TORCH_CHECK(shared_len[i] == 0 || (from >= 0 && from < n && shared_len[i] <= std::min(length[i], length[from])),
                        "decode attention: row ", i, " reads ", shared_len[i], " columns of row ", from);
        }
        // Rows that read the same slot's columns one after the other (stable: the rest keep
        // their order).
        std::vector<int64_t> order(n);
        for (int64_t i = 0; i < n; ++i) order[i] = i;
        const auto source = [&](int64_t i) { return shared_len[i] > 0 ? shared_slot[i] : i; };
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return source(a) < source(b); });
        const auto columns = [&](const float* base, const Strides& st, int64_t row, int64_t kv) {
            return Columns{base + source(row) * st.row + kv * st.head, base + row * st.row + kv * st.head,
                           shared_len[row], length[row], st.column};
        };
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
                const int64_t row = order[unit / kv_heads], kv = unit % kv_heads, first = row * heads + kv * group;
                score(qp + first * d, columns(kp, ks, row, kv), sp + first * span, span, group, d, scale_f);
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
                const int64_t row = order[unit / kv_heads], kv = unit % kv_heads, first = row * heads + kv * group;
                weigh(pp + first * span, columns(vp, vs, row, kv), op + first * d, span, group, d);
            }
        });
        *out = new at::Tensor(std::move(result));
    });
}

}  // extern "C"
