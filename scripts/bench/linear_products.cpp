// One linear layer's product at decode and prefill sizes, on CPU, in the ways libtorch
// offers: MKL's x·Wᵀ, oneDNN with the weight packed once (petting's sampler's own
// functions, csrc/onednn_linear.cpp, built into this program), bf16 (AMX where the CPU
// has it), float32 under oneDNN's "bf16 fpmath" mode, and a split bf16 "×3" product;
// then an MLP block with and without oneDNN's fused post-ops. Prints milliseconds (mean
// of 100 calls) and the error relative to a float64 product. BENCHMARKS.md, "Sampling
// engines", quotes it.
//
//   L=.libtorch; g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -DGLOG_USE_GLOG_EXPORT -I$L/include \
//       scripts/bench/linear_products.cpp csrc/onednn_linear.cpp csrc/ffi.cpp -o /tmp/linear_products \
//       -L$L/lib -Wl,-rpath,$L/lib -ltorch_cpu -lc10
//   /tmp/linear_products 128 1536 576      # ROWS OUT IN
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

extern "C" {
void petting_free_error(char* message);
char* petting_pack_linear_weight(const at::Tensor* weight, at::Tensor** packed);
char* petting_packed_linear(const at::Tensor* x, const at::Tensor* packed, const at::Tensor* bias, at::Tensor** out);
}

namespace {

// The tensor a petting function wrote, or its error thrown.
at::Tensor take(char* error, at::Tensor* out) {
    if (error != nullptr) {
        const std::string message(error);
        petting_free_error(error);
        throw std::runtime_error(message);
    }
    at::Tensor tensor = std::move(*out);
    delete out;
    return tensor;
}

at::Tensor pack(const at::Tensor& w) {
    at::Tensor* out = nullptr;
    char* error = petting_pack_linear_weight(&w, &out);
    return take(error, out);
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w) {
    at::Tensor* out = nullptr;
    char* error = petting_packed_linear(&x, &w, nullptr, &out);
    return take(error, out);
}

// onednn_linear(x) followed by SiLU, fused into the product.
at::Tensor onednn_linear_silu(const at::Tensor& x, const at::Tensor& w) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              std::string_view, c10::List<std::optional<c10::Scalar>>,
                              std::optional<std::string_view>)>();
    return op.call(x, w, std::nullopt, "swish", c10::List<std::optional<c10::Scalar>>(), std::nullopt);
}

// onednn_linear(x) <binary> other, fused into the product.
at::Tensor onednn_linear_then(const at::Tensor& x, const at::Tensor& other, const at::Tensor& w, std::string_view binary) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("mkldnn::_linear_pointwise", "binary")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                 const std::optional<at::Tensor>&, std::string_view)>();
    return op.call(x, other, w, std::nullopt, binary);
}

template <class F>
double milliseconds(F f) {
    f();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i) f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 10.0;
}

void set_bf16_fpmath(bool on) {
    at::globalContext().setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL,
                                            on ? at::Float32Precision::BF16 : at::Float32Precision::IEEE);
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t rows = argc > 1 ? atoi(argv[1]) : 128, out = argc > 2 ? atoi(argv[2]) : 1536,
                  in = argc > 3 ? atoi(argv[3]) : 576;
    at::NoGradGuard no_grad;
    at::manual_seed(0);
    const auto x = at::randn({rows, in});
    const auto w = at::randn({out, in}) * 0.05;
    const auto exact = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
    const auto error = [&](const at::Tensor& y) {
        return ((y.to(at::kDouble) - exact).abs().max() / exact.abs().max()).item().toDouble();
    };
    const auto report = [&](const char* name, auto f) {
        std::printf("%-34s %8.3f ms  error %.1e\n", name, milliseconds(f), error(f()));
    };
    std::printf("%ld rows, %ld -> %ld\n", rows, in, out);
    const auto packed = pack(w);
    report("float32, MKL x.linear", [&] { return at::linear(x, w); });
    report("float32, oneDNN packed", [&] { return onednn_linear(x, packed); });
    const auto xb = x.to(at::kBFloat16);
    const auto packed_bf16 = pack(w.to(at::kBFloat16));
    report("bf16, oneDNN packed", [&] { return onednn_linear(xb, packed_bf16).to(at::kFloat); });
    // The split: w = wh + wl and x = xh + xl, each part exact in bf16; x·w ≈ xh·wh + xh·wl +
    // xl·wh, each product exact in float32 accumulation. Under the bf16 fpmath mode oneDNN
    // takes float32 tensors holding bf16 values; packed float32 weights keep it on float32.
    set_bf16_fpmath(true);
    report("float32 under bf16 fpmath", [&] { return onednn_linear(x, w); });
    const auto wh = w.to(at::kBFloat16).to(at::kFloat), wl = (w - wh).to(at::kBFloat16).to(at::kFloat);
    report("bf16 x3 split under bf16 fpmath", [&] {
        const auto xh = x.to(at::kBFloat16).to(at::kFloat), xl = x - xh;
        return onednn_linear(xh, wh) + onednn_linear(xh, wl) + onednn_linear(xl, wh);
    });
    set_bf16_fpmath(false);

    // An MLP block of SmolLM2's shape: down(silu(gate(h)) · up(h)) + h.
    const auto h = at::randn({rows, 576});
    const auto gate = pack(at::randn({1536, 576}) * 0.05), up = pack(at::randn({1536, 576}) * 0.05),
               down = pack(at::randn({576, 1536}) * 0.05);
    const auto plain = [&] { return onednn_linear(at::silu(onednn_linear(h, gate)) * onednn_linear(h, up), down) + h; };
    const auto fused = [&] {
        return onednn_linear_then(onednn_linear_then(h, onednn_linear_silu(h, gate), up, "mul"), h, down, "add");
    };
    std::printf("MLP block: %.3f ms, with fused post-ops %.3f ms (differ by %.1e)\n", milliseconds(plain),
                milliseconds(fused), (plain() - fused()).abs().max().item().toDouble());
}
