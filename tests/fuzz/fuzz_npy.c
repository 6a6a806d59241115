/* libFuzzer entry point for the npy reader; the body is mr_fuzz_npy in tests/fuzz/fuzz_targets.h.
 * Built and run by tests/fuzz/run.sh. */
#include "tests/fuzz/fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return mr_fuzz_npy(data, size); }
