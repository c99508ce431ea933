// How petting's C++ functions report errors to Rust: each returns NULL on success, or an
// error message the caller frees with petting_free_error (csrc/ffi.cpp).
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace petting {

inline char* error_message(const std::string& what) {
    char* copy = static_cast<char*>(std::malloc(what.size() + 1));
    if (copy != nullptr) std::memcpy(copy, what.c_str(), what.size() + 1);
    return copy;
}

// Runs f, turning a C++ exception (libtorch's TORCH_CHECK among them) into its message.
template <typename F>
char* guarded(F f) {
    try {
        f();
        return nullptr;
    } catch (const std::exception& e) {
        return error_message(e.what());
    }
}

}  // namespace petting
