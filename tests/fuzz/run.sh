#!/usr/bin/env bash
# Fuzzes mirror's readers of untrusted input with libFuzzer (clang -fsanitize=fuzzer,address,undefined):
#   fuzz_idx (IDX, plain and gzipped), fuzz_tokens (u16/u32 token files, raw and llm.c header),
#   fuzz_text (text, bytes and UTF-8 chars), fuzz_config (experiment YAML), fuzz_ckpt (HDF5 checkpoints:
#   verify, open, attributes, every dataset), fuzz_hdf5 (HDF5 data files through mr_data_from_hdf5).
# CMake builds the same targets with tests/fuzz/driver.c (no libFuzzer needed) and CTest runs them
# (fuzz.<target>) and this script's build + replay (fuzz.libfuzzer), so neither can rot unnoticed.
# The target bodies live in tests/fuzz/fuzz_targets.h; the seeds in tests/fuzz/corpus/<target>/.
#
#   tests/fuzz/run.sh [target...]            fuzz each target FUZZ_SECONDS (default 60) from its corpus
#   tests/fuzz/run.sh --replay [target...]   run every corpus file once through each target (regression)
#
# Environment: FUZZ_SECONDS, FUZZ_JOBS (parallel fuzzing processes per target, default 1),
# FUZZ_BUILD (binaries and work dirs, default build-fuzz/), CC (default clang-14, else clang),
# FUZZ_SKIP_WITHOUT_CLANG=1 exits 77 (skipped) when there is no clang (CTest),
# FUZZ_KEEP_GOING=1 records every crash/leak/timeout and fuzzes on (fork mode) instead of stopping,
# FUZZ_KEEP_CORPUS=1 merges the new inputs into tests/fuzz/corpus/ (minimized with -merge=1).
# New inputs go to $FUZZ_BUILD/corpus/<target>/ (not the repo), crashes to $FUZZ_BUILD/artifacts/<target>/;
# the script exits 1 when any target crashed, leaked or timed out. Inputs that crash go to
# tests/fuzz/crashes/ by hand once understood, and never into the replayed corpus (CTest replays it
# through tests/unit/test_fuzz_corpus.c).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

replay=0
if [ "${1:-}" = "--replay" ]; then replay=1; shift; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(idx tokens text config ckpt hdf5 npy tfrecord iterstate)
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-1}"
out="${FUZZ_BUILD:-$root/build-fuzz}"
cc="${CC:-}"
if [ -z "$cc" ]; then
    if command -v clang-14 >/dev/null 2>&1; then cc=clang-14; else cc=clang; fi
fi
if [ "${FUZZ_SKIP_WITHOUT_CLANG:-0}" = 1 ] && ! command -v "$cc" >/dev/null 2>&1; then
    echo "tests/fuzz/run.sh: no $cc (libFuzzer needs clang): skipped"; exit 77
fi

# ---- build --------------------------------------------------------------------------------------
# Only what the readers link: core status/dtype/shape/rng and the HDF5 error layer (h5_util.c), data/,
# checkpoint/, launch/config*.c but config_train.c (the trainer's mapping: devices, not parsing), core/trace.c
# (the plan and the data iterator record spans when a trace window is open),
# models/ (the config's model defaults, and the layer-graph check: a walk that builds the layers on a
# scratch graph, so autodiff/ and the op table with its kernels come too; --gc-sections drops the
# rest). CTest's fuzz.libfuzzer builds this list, so a missing file fails the suite.
hdf5_cflags=$(pkg-config --cflags hdf5-serial 2>/dev/null || echo "-I/usr/include/hdf5/serial")
hdf5_libs=$(pkg-config --libs hdf5-serial 2>/dev/null || echo "-L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5")
yaml_libs=$(pkg-config --libs yaml-0.1 2>/dev/null || echo "-lyaml")
zlib_libs=$(pkg-config --libs zlib 2>/dev/null || echo "-lz")
pbc_libs=$(pkg-config --libs libprotobuf-c 2>/dev/null || echo "-lprotobuf-c")
# data/source_tfrecord.c decodes tf.train.Example with protobuf-c: its C code from proto/example.proto
mkdir -p "$out/gen/proto"
if [ ! -f "$out/gen/proto/example.pb-c.c" ] || [ proto/example.proto -nt "$out/gen/proto/example.pb-c.c" ]; then
    command -v protoc-c >/dev/null || { echo "tests/fuzz/run.sh: protoc-c not found; HINT: apt-get install protobuf-c-compiler libprotobuf-c-dev"; exit 2; }
    protoc-c --c_out="$out/gen/proto" -I proto proto/example.proto
fi
lib_sources=(core/status.c core/dtype.c core/shape.c core/rng.c core/h5_util.c data/*.c checkpoint/*.c
             $(ls launch/config*.c | grep -v config_train.c) models/models.c models/layers.c autodiff/*.c
             core/op_table.c core/op_util.c core/ref/*.c core/cpu/*.c core/tensor.c core/device.c core/alloc_cache.c
             core/vec.c core/trace.c "$out/gen/proto/example.pb-c.c")
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fopenmp -ffunction-sections -Wno-pass-failed -I. -I"$out/gen"
       $hdf5_cflags
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
mkdir -p "$out/obj" "$out/bin"

# The library objects once (with -fsanitize=fuzzer-no-link: coverage without libFuzzer's main).
objs=()
for src in "${lib_sources[@]}"; do
    obj="$out/obj/$(echo "$src" | tr '/' '_').o"
    if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$0" -nt "$obj" ] ||
       [ -n "$(find "$(dirname "$src")" core data launch models -name '*.h' -newer "$obj" 2>/dev/null | head -1)" ]; then
        if [ "$src" = models/models.c ]; then # not fuzzed, no sanitizer metadata that keeps sections alive
            "$cc" -std=c11 -D_GNU_SOURCE -g -O1 -ffunction-sections -fdata-sections -I. -c "$src" -o "$obj"
        else
            "$cc" "${flags[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" \
                -c "$src" -o "$obj"
        fi
    fi
    objs+=("$obj")
done
for t in "${targets[@]}"; do
    [ -f "$here/fuzz_$t.c" ] || { echo "tests/fuzz/run.sh: no target '$t' (idx tokens text config ckpt hdf5 npy tfrecord iterstate)"; exit 2; }
    bin="$out/bin/fuzz_$t"
    if [ ! -x "$bin" ] || [ -n "$(find "$here" "${objs[@]}" -newer "$bin" \( -name '*.c' -o -name '*.h' -o -name '*.o' \) | head -1)" ]; then
        "$cc" "${flags[@]}" "$here/fuzz_$t.c" "${objs[@]}" -Wl,--gc-sections $hdf5_libs $yaml_libs $zlib_libs $pbc_libs -lm -lpthread -o "$bin"
    fi
done

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# leaks inside libhdf5 on crafted files are HDF5's (tests/fuzz/README.md "HDF5 findings")
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$here/lsan_hdf5.supp:print_suppressions=0}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# 1 GiB of RSS and 10 s per input: a bigger or slower run on a <= 64 KiB input is a finding.
common=(-rss_limit_mb=1024 -malloc_limit_mb=1024 -timeout=10 -max_len=65536)

# ---- replay -------------------------------------------------------------------------------------
status=0
if [ $replay = 1 ]; then
    for t in "${targets[@]}"; do
        files=("$here/corpus/$t"/*)
        if [ ! -f "${files[0]}" ]; then # an empty corpus replays nothing: a failure, not a pass
            echo "replay $t: FAILED (no corpus files in $here/corpus/$t)"; status=1; continue
        fi
        if "$out/bin/fuzz_$t" "${common[@]}" -runs=1 "${files[@]}" >"$out/replay_$t.log" 2>&1; then
            echo "replay $t: ${#files[@]} inputs OK"
        else
            echo "replay $t: FAILED (log: $out/replay_$t.log)"; tail -40 "$out/replay_$t.log"; status=1
        fi
    done
    exit $status
fi

# ---- fuzz ---------------------------------------------------------------------------------------
printf "%-8s %8s %10s %10s %8s %8s %s\n" target seconds execs exec/s cov ft result
for t in "${targets[@]}"; do
    work="$out/corpus/$t"; art="$out/artifacts/$t/"
    mkdir -p "$work" "$art"
    log="$out/fuzz_$t.log"
    result=ok
    # FUZZ_KEEP_GOING=1: fork mode that records crashes/leaks/timeouts in $art and goes on fuzzing
    # (to look past a known bug); the default stops at the first one.
    mode=()
    if [ "${FUZZ_KEEP_GOING:-0}" = 1 ]; then
        mode=(-fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
    elif [ "$jobs" -gt 1 ]; then
        mode=(-jobs="$jobs" -workers="$jobs")
    fi
    # libFuzzer writes its per-job logs (fuzz-N.log) to the current directory: one per target
    if ! (cd "$out/artifacts/$t" && "$out/bin/fuzz_$t" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 \
         -artifact_prefix="$art" "${mode[@]}" "$work" "$here/corpus/$t") >"$log" 2>&1; then
        result="FAILED (see $log, inputs in $art)"; status=1
    fi
    if ls "$out/artifacts/$t"/fuzz-*.log >/dev/null 2>&1; then
        cat "$out/artifacts/$t"/fuzz-*.log >>"$log"; rm -f "$out/artifacts/$t"/fuzz-*.log
    fi
    if [ "${FUZZ_KEEP_GOING:-0}" = 1 ] && ls "$art" | grep -qE '^(crash|leak|timeout|oom)-'; then
        result="FAILED ($(ls "$art" | grep -cE '^(crash|leak|timeout|oom)-') inputs in $art, log $log)"; status=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}' || true)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}' || true)
    if [ "$execs" = 0 ]; then # fork mode prints no final stats: the last status line's counters
        execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
        rate=$(( ${execs:-0} / (seconds > 0 ? seconds : 1) ))
    fi
    cov=$(grep -oE '(#[0-9]+).*cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+)/\1 \2/' || true)
    if [ "$result" = ok ] && [ "${execs:-0}" = 0 ]; then # a fuzzer that ran no input tested nothing
        result="FAILED (no inputs executed, see $log)"; status=1
    fi
    printf "%-8s %8s %10s %10s %8s %8s %s\n" "$t" "$seconds" "$execs" "$rate" ${cov:-? ?} "$result"
    if [ "${FUZZ_KEEP_CORPUS:-0}" = 1 ] && [ "$result" = ok ]; then
        "$out/bin/fuzz_$t" "${common[@]}" -merge=1 "$here/corpus/$t" "$work" >>"$log" 2>&1 || true
    fi
done
exit $status
