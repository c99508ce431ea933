// Float32 linear layers through oneDNN with weights packed once, for petting's sampler on
// CPU. libtorch's plain x·Wᵀ (MKL) repacks the weight on every call; oneDNN's own blocked
// layout, made once per generate call, multiplies 1.2-2.5x faster on decode-sized batches
// (BENCHMARKS.md, "Sampling engines"). The ops are libtorch's own (the ones its
// inductor backend calls when it freezes a model for CPU), reached through the dispatcher
// because tch's generated bindings do not include the `mkldnn::` namespace.
//
// Errors as csrc/ffi.h says.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

#include "ffi.h"

namespace {

// The batch size oneDNN chooses the packed layout for: it serves every batch size from
// a single decoding row to a 2048-position prefill within a few percent of the layout
// made for that size (vLLM's CPU backend packs for the same).
constexpr int64_t kPackedForBatch = 32;

}  // namespace

extern "C" {

bool petting_onednn_available() { return at::hasMKLDNN(); }

// weight (out, in) float32 on CPU → an opaque packed tensor for petting_packed_linear.
char* petting_pack_linear_weight(const at::Tensor* weight, at::Tensor** packed) {
    return petting::guarded([&] {
        static const auto op = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                                   .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
        *packed = new at::Tensor(op.call(weight->contiguous(), kPackedForBatch));
    });
}

// x (…, in) · Wᵀ + bias, W packed by petting_pack_linear_weight; bias may be NULL.
char* petting_packed_linear(const at::Tensor* x, const at::Tensor* packed, const at::Tensor* bias,
                            at::Tensor** out) {
    return petting::guarded([&] {
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
