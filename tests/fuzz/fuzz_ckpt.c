/* libFuzzer entry point for the ckpt reader; the body is mr_fuzz_ckpt in tests/fuzz/fuzz_targets.h.
 * Built with libFuzzer by tests/fuzz/run.sh and with tests/fuzz/driver.c by CMake (CTest fuzz.ckpt). */
#include "tests/fuzz/fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return mr_fuzz_ckpt(data, size); }
