// SPDX-License-Identifier: Apache-2.0
//
// grid2d3d: kernels that index by more than blockIdx.x. A wrap that hands out virtual block
// indices must rebuild all three of blockIdx.x/y/z from one linear index (and keep
// gridDim.x/y/z the launch's), so the zoo needs a 2D and a 3D grid:
//   transpose2d  2D grid (blockIdx.x, blockIdx.y), 32x8 threads, tiled through shared memory
//                with one __syncthreads between the tile's load and its store (a barrier
//                that every thread reaches: bounds checks guard the accesses, no return)
//   volume3d     3D grid, a grid-stride loop in each of x, y and z (uses gridDim.x/y/z)
//
// Expected loop verdict: both loopable.
//
// Output: result <kernel> ok|mismatch, checksum <kernel> <%.6e>; exit 0 ok, 1 mismatch,
// 2 a CUDA call failed (cuda_error <what> <name>).

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "zoo.h"

#define TILE 32
#define ROWS 8 // blockDim.y: each thread moves TILE / ROWS elements of the tile

// out (w rows of h) = transpose of in (h rows of w). blockDim must be (TILE, ROWS). The +1
// column keeps the column-wise read of the tile free of bank conflicts.
extern "C" __global__ void transpose2d(const float *in, float *out, int w, int h) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        if (x < w && y + j < h)
            tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * w + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x; // column of out (out has h columns)
    y = blockIdx.x * TILE + threadIdx.y; // row of out (out has w rows)
    for (int j = 0; j < TILE; j += ROWS)
        if (x < h && y + j < w)
            out[(size_t)(y + j) * h + x] = tile[threadIdx.x][threadIdx.y + j];
}

// In place, v[z][y][x] = 2 v + (x + 3y + 5z): the added term depends on all three
// coordinates, so an element processed with a wrong blockIdx.y or .z shows up.
extern "C" __global__ void volume3d(float *v, int nx, int ny, int nz) {
    for (int z = blockIdx.z * blockDim.z + threadIdx.z; z < nz; z += blockDim.z * gridDim.z)
        for (int y = blockIdx.y * blockDim.y + threadIdx.y; y < ny; y += blockDim.y * gridDim.y)
            for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < nx;
                 x += blockDim.x * gridDim.x) {
                size_t idx = ((size_t)z * ny + y) * nx + x;
                v[idx] = 2.0f * v[idx] + (float)(x + 3 * y + 5 * z);
            }
}

static int check_transpose() {
    // Neither dimension a multiple of TILE: the edge tiles are partial in both directions.
    const int w = 2053, h = 1500;
    const size_t count = (size_t)w * h;
    float *hin = (float *)malloc(sizeof(float) * count);
    float *hout = (float *)malloc(sizeof(float) * count);
    if (!hin || !hout) {
        fprintf(stderr, "grid2d3d: out of host memory\n");
        exit(2);
    }
    for (size_t i = 0; i < count; ++i)
        hin[i] = (float)(1 + i % 1021); // non-zero, exact, and varying along both axes

    float *din, *dout;
    CHECK("cudaMalloc", cudaMalloc(&din, sizeof(float) * count));
    CHECK("cudaMalloc", cudaMalloc(&dout, sizeof(float) * count));
    CHECK("cudaMemcpy", cudaMemcpy(din, hin, sizeof(float) * count, cudaMemcpyHostToDevice));
    // A value no element of in has: an element the kernel never wrote is caught.
    CHECK("cudaMemset", cudaMemset(dout, 0xff, sizeof(float) * count));

    dim3 block(TILE, ROWS);
    dim3 grid((w + TILE - 1) / TILE, (h + TILE - 1) / TILE); // 65 x 47 = 3055 blocks
    transpose2d<<<grid, block>>>(din, dout, w, h);
    CHECK("transpose2d", cudaGetLastError());
    CHECK("transpose2d", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(hout, dout, sizeof(float) * count, cudaMemcpyDeviceToHost));

    int bad = 0;
    double sum = 0.0;
    for (int r = 0; r < w; ++r)
        for (int c = 0; c < h; ++c) {
            float got = hout[(size_t)r * h + c];
            float want = hin[(size_t)c * w + r];
            if (got != want && !bad) {
                fprintf(stderr, "transpose2d: out[%d][%d] = %g, want %g\n", r, c, got, want);
                bad = 1;
            }
            // Weighted by position: a transposition that put the right values in the wrong
            // places would still have the plain sum right.
            sum += (double)got * (double)((r * 7 + c) % 13 + 1);
        }
    printf("result transpose2d %s\n", bad ? "mismatch" : "ok");
    printf("checksum transpose2d %.6e\n", sum);
    cudaFree(din);
    cudaFree(dout);
    free(hin);
    free(hout);
    return bad;
}

static int check_volume() {
    const int nx = 150, ny = 100, nz = 70;
    const size_t count = (size_t)nx * ny * nz;
    float *hv = (float *)malloc(sizeof(float) * count);
    float *hout = (float *)malloc(sizeof(float) * count);
    if (!hv || !hout) {
        fprintf(stderr, "grid2d3d: out of host memory\n");
        exit(2);
    }
    for (size_t i = 0; i < count; ++i)
        hv[i] = (float)(1 + i % 509);

    float *dv;
    CHECK("cudaMalloc", cudaMalloc(&dv, sizeof(float) * count));
    CHECK("cudaMemcpy", cudaMemcpy(dv, hv, sizeof(float) * count, cudaMemcpyHostToDevice));

    // 8 x 6 x 9 = 432 blocks of 8x8x4 threads; the grid covers 64 x 48 x 36 points per stride,
    // so every axis loops (3, 3 and 2 times).
    dim3 block(8, 8, 4);
    dim3 grid(8, 6, 9);
    volume3d<<<grid, block>>>(dv, nx, ny, nz);
    CHECK("volume3d", cudaGetLastError());
    CHECK("volume3d", cudaDeviceSynchronize());
    CHECK("cudaMemcpy", cudaMemcpy(hout, dv, sizeof(float) * count, cudaMemcpyDeviceToHost));

    int bad = 0;
    double sum = 0.0;
    for (int z = 0; z < nz; ++z)
        for (int y = 0; y < ny; ++y)
            for (int x = 0; x < nx; ++x) {
                size_t idx = ((size_t)z * ny + y) * nx + x;
                float want = 2.0f * hv[idx] + (float)(x + 3 * y + 5 * z);
                if (hout[idx] != want && !bad) {
                    fprintf(stderr, "volume3d: v[%d][%d][%d] = %g, want %g\n", z, y, x,
                            hout[idx], want);
                    bad = 1;
                }
                sum += hout[idx];
            }
    printf("result volume3d %s\n", bad ? "mismatch" : "ok");
    printf("checksum volume3d %.6e\n", sum);
    cudaFree(dv);
    free(hv);
    free(hout);
    return bad;
}

int main() {
    int bad = check_transpose();
    bad |= check_volume();
    return bad;
}
