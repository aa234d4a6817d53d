// SPDX-License-Identifier: Apache-2.0
//
// driver_util.h: what the driver-API examples share: CUresult names, a REQUIRE that stops the
// program with "fatal CALL ERROR" on stdout (the GPU tests read it), PTX read from a file,
// and the JIT log of a PTX that does not load. Define EXAMPLE_NAME before including it.
#ifndef CLC_EXAMPLES_DRIVER_UTIL_H
#define CLC_EXAMPLES_DRIVER_UTIL_H

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>

static const char *error_name(CUresult r) {
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
        return "CUDA_ERROR_UNRECOGNIZED";
    return name;
}

#define REQUIRE(call)                                                                         \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            fprintf(stderr, EXAMPLE_NAME ": %s failed at %s:%d: %s\n", #call, __FILE__,       \
                    __LINE__, error_name(r_));                                                \
            printf("fatal %s %s\n", #call, error_name(r_));                                   \
            exit(3);                                                                          \
        }                                                                                     \
    } while (0)

// The whole file, NUL-terminated (PTX given to cuModuleLoadData and cuLibraryLoadData must
// end in a NUL); NULL on failure.
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long size = ftell(f);
    rewind(f);
    if (size <= 0) {
        fclose(f);
        return NULL;
    }
    char *buf = (char *)malloc((size_t)size + 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[size] = '\0';
    fclose(f);
    return buf;
}

// A failed JIT says little through the plain load; ask again with a log buffer so one run
// shows why (PTX newer than the driver, wrong target).
static void explain_load_failure(const char *ptx) {
    char log[8192] = {0};
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, (void *)(size_t)sizeof(log)};
    CUmodule m;
    CUresult r = cuModuleLoadDataEx(&m, ptx, 2, opts, vals);
    fprintf(stderr, EXAMPLE_NAME ": cuModuleLoadDataEx: %s; JIT log:\n%s\n", error_name(r), log);
}

#endif
