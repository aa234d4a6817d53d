/* SPDX-License-Identifier: Apache-2.0
 *
 * cupti_abi.h: the part of CUPTI's ABI that cupti.c uses, declared with the fields it reads
 * (cupti_activity.h's CUpti_Activity and CUpti_ActivityKernel10, cupti_callbacks.h's
 * CUpti_CallbackData; tests/unit/test_cupti_abi.py checks them and the constants against the
 * headers). CUPTI keeps them stable across versions: new fields are only ever appended.
 */
#ifndef CLC_CUPTI_ABI_H
#define CLC_CUPTI_ABI_H
#include <stdint.h>

typedef int clc_cupti_result;
#define CLC_CUPTI_SUCCESS 0
#define CLC_CUPTI_ERROR_NOT_INITIALIZED 15
#define CLC_CUPTI_ERROR_NOT_COMPATIBLE 14
#define CLC_CUPTI_ERROR_NOT_SUPPORTED 27
#define CLC_CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED 33
#define CLC_CUPTI_ERROR_INSUFFICIENT_PRIVILEGES 35
#define CLC_CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED 39
#define CLC_CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES 40
#define CLC_CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED 41
#define CLC_CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED 42
#define CLC_CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED 43
#define CLC_CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED 44
#define CLC_CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED 45
#define CLC_CUPTI_KIND_CONCURRENT_KERNEL 10
#define CLC_CUPTI_FLUSH_FORCED 1
#define CLC_CUPTI_API_ENTER 0
#define CLC_CUPTI_API_EXIT 1
#define CLC_CUPTI_DOMAIN_DRIVER 1
#define CLC_CUPTI_DOMAIN_RUNTIME 2
/* CUPTI_DRIVER_TRACE_CBID_*: cuLaunchKernel, _ptsz, cuLaunchCooperativeKernel, _ptsz,
 * cuLaunchKernelEx, _ptsz */
static const uint32_t CLC_CUPTI_DRIVER_LAUNCHES[] = {307, 442, 477, 478, 652, 653};
/* CUPTI_RUNTIME_TRACE_CBID_*: cudaLaunchKernel_v7000, _ptsz, cudaLaunchCooperativeKernel_v9000,
 * _ptsz, cudaLaunchKernelExC_v11060, _ptsz, __cudaLaunchKernel_v13000, _ptsz */
static const uint32_t CLC_CUPTI_RUNTIME_LAUNCHES[] = {211, 214, 269, 270, 430, 431, 505, 506};

typedef struct {
    uint32_t kind;
} clc_cupti_activity;

typedef struct {
    uint32_t kind;
    uint8_t cache_config, shared_config;
    uint16_t registers;
    uint32_t cache_requested, cache_executed;
    uint64_t start, end, completed;
    uint32_t device, context, stream;
    int32_t grid[3], block[3], static_shared, dynamic_shared;
    uint32_t local_per_thread, local_total;
    uint32_t correlation;
} clc_cupti_kernel; /* CUpti_ActivityKernel10's first fields */

typedef struct {
    uint32_t site; /* CLC_CUPTI_API_ENTER or _EXIT */
    const char *function_name;
    const void *function_params;
    void *function_return;
    const char *symbol_name;
    void *context;
    uint32_t context_uid;
    uint64_t *correlation_data;
    uint32_t correlation; /* the API call's, which its kernel's activity record carries */
} clc_cupti_callback_data; /* CUpti_CallbackData */

#endif
