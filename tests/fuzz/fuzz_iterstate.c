/* libFuzzer entry point for the data-iterator state (checkpoints' /state/data_iter blobs); the body
 * is mr_fuzz_iterstate in tests/fuzz/fuzz_targets.h. Built and run by tests/fuzz/run.sh and CTest. */
#include "tests/fuzz/fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return mr_fuzz_iterstate(data, size); }
