#include "ffi.h"

extern "C" void petting_free_error(char* message) { std::free(message); }
