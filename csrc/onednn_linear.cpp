// Float32 linear layers through oneDNN with weights packed once, for petting's sampler on
// CPU. libtorch's plain x·Wᵀ (MKL) repacks the weight on every call; oneDNN's own blocked
// layout, made once per generate call, multiplies 1.2-2.5x faster on decode-sized batches
// (BENCHMARKS.md, "Packed linear layers"). The ops are libtorch's own (the ones its
// inductor backend calls when it freezes a model for CPU), reached through the dispatcher
// because tch's generated bindings do not include the `mkldnn::` namespace.
//
// Each function returns NULL on success, or an error message the caller frees with
// petting_free_error.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstring>
#include <optional>
#include <string>

namespace {

char* error_message(const std::string& what) {
    char* copy = static_cast<char*>(std::malloc(what.size() + 1));
    if (copy != nullptr) std::memcpy(copy, what.c_str(), what.size() + 1);
    return copy;
}

template <typename F>
char* guarded(F f) {
    try {
        f();
        return nullptr;
    } catch (const std::exception& e) {
        return error_message(e.what());
    }
}

// The batch size oneDNN chooses the packed layout for: it serves every batch size from
// a single decoding row to a 2048-position prefill within a few percent of the layout
// made for that size (vLLM's CPU backend packs for the same).
constexpr int64_t kPackedForBatch = 32;

}  // namespace

extern "C" {

void petting_free_error(char* message) { std::free(message); }

bool petting_onednn_available() { return at::hasMKLDNN(); }

// weight (out, in) float32 on CPU → an opaque packed tensor for petting_packed_linear.
char* petting_pack_linear_weight(const at::Tensor* weight, at::Tensor** packed) {
    return guarded([&] {
        static const auto op = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                                   .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
        *packed = new at::Tensor(op.call(weight->contiguous(), kPackedForBatch));
    });
}

// x (…, in) · Wᵀ + bias, W packed by petting_pack_linear_weight; bias may be NULL.
char* petting_packed_linear(const at::Tensor* x, const at::Tensor* packed, const at::Tensor* bias,
                            at::Tensor** out) {
    return guarded([&] {
        static const auto op =
            c10::Dispatcher::singleton()
                .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                  std::string_view, c10::List<std::optional<c10::Scalar>>,
                                  std::optional<std::string_view>)>();
        std::optional<at::Tensor> b;
        if (bias != nullptr) b = *bias;
        *out = new at::Tensor(op.call(x->contiguous(), *packed, b, "none", c10::List<std::optional<c10::Scalar>>(), std::nullopt));
    });
}

}  // extern "C"
