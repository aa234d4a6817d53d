// SPDX-License-Identifier: Apache-2.0
//
// zoo.h: what every zoo program shares.
#ifndef CLC_ZOO_H
#define CLC_ZOO_H

#include <stdio.h>
#include <stdlib.h>

// Every CUDA call is checked: a failure means the run says nothing about the kernel, so it
// stops with its own status (2), distinct from a wrong result (1).
#define CHECK(what, call)                                                                     \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("cuda_error %s %s\n", what, cudaGetErrorName(err_));                       \
            fflush(stdout);                                                                   \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

#endif
