# SPDX-License-Identifier: Apache-2.0
"""shim/records/cupti_abi.h, CUPTI's ABI as the shim declares it, against NVIDIA's own headers: a
program built with both checks each field's offset, each constant and each list of callback
ids."""

import pathlib
import shutil
import subprocess

import pytest

from harness import ROOT  # noqa: F401  (puts tests/fixtures/native on sys.path)
from build import BuildError, cuda_include_dir  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]

CHECK = r"""
#include <stddef.h>
#include <stdio.h>
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#include "cupti_abi.h"

static int bad;
#define SAME(what, a, b) do { if ((long)(a) != (long)(b)) { \
    printf("%s: %ld, cupti.h %ld\n", what, (long)(a), (long)(b)); bad = 1; } } while (0)
#define ERR(name) SAME("ERROR_" #name, CLC_CUPTI_ERROR_##name, CUPTI_ERROR_##name)
#define FIELD(mine, theirs, f, g) SAME(#mine "." #f, offsetof(mine, f), offsetof(theirs, g))
#define LIST(mine, ...) do { const long theirs[] = {__VA_ARGS__}; \
    SAME(#mine " length", sizeof mine / sizeof *mine, sizeof theirs / sizeof *theirs); \
    for (unsigned i = 0; i < sizeof theirs / sizeof *theirs; i++) SAME(#mine, mine[i], theirs[i]); \
} while (0)

int main(void) {
    FIELD(clc_cupti_activity, CUpti_Activity, kind, kind);
    FIELD(clc_cupti_kernel, CUpti_ActivityKernel10, kind, kind);
    FIELD(clc_cupti_kernel, CUpti_ActivityKernel10, start, start);
    FIELD(clc_cupti_kernel, CUpti_ActivityKernel10, end, end);
    FIELD(clc_cupti_kernel, CUpti_ActivityKernel10, correlation, correlationId);
    FIELD(clc_cupti_callback_data, CUpti_CallbackData, site, callbackSite);
    FIELD(clc_cupti_callback_data, CUpti_CallbackData, correlation, correlationId);
    SAME("sizeof callback data", sizeof(clc_cupti_callback_data), sizeof(CUpti_CallbackData));
    SAME("SUCCESS", CLC_CUPTI_SUCCESS, CUPTI_SUCCESS);
    ERR(NOT_INITIALIZED); ERR(NOT_COMPATIBLE); ERR(NOT_SUPPORTED);
    ERR(VIRTUALIZED_DEVICE_NOT_SUPPORTED); ERR(INSUFFICIENT_PRIVILEGES);
    ERR(MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED); ERR(VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES);
    ERR(CONFIDENTIAL_COMPUTING_NOT_SUPPORTED); ERR(CMP_DEVICE_NOT_SUPPORTED);
    ERR(MIG_DEVICE_NOT_SUPPORTED); ERR(SLI_DEVICE_NOT_SUPPORTED); ERR(WSL_DEVICE_NOT_SUPPORTED);
    SAME("KIND_CONCURRENT_KERNEL", CLC_CUPTI_KIND_CONCURRENT_KERNEL,
         CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    SAME("FLUSH_FORCED", CLC_CUPTI_FLUSH_FORCED, CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    SAME("API_ENTER", CLC_CUPTI_API_ENTER, CUPTI_API_ENTER);
    SAME("API_EXIT", CLC_CUPTI_API_EXIT, CUPTI_API_EXIT);
    SAME("DOMAIN_DRIVER", CLC_CUPTI_DOMAIN_DRIVER, CUPTI_CB_DOMAIN_DRIVER_API);
    SAME("DOMAIN_RUNTIME", CLC_CUPTI_DOMAIN_RUNTIME, CUPTI_CB_DOMAIN_RUNTIME_API);
    LIST(CLC_CUPTI_DRIVER_LAUNCHES, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
         CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
         CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
         CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
         CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz);
    LIST(CLC_CUPTI_RUNTIME_LAUNCHES, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
         CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000,
         CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000);
    return bad;
}
"""


def _include():
    try:
        return cuda_include_dir("cupti_activity.h")
    except BuildError:
        return None


def test_the_shims_cupti_declarations_match_nvidias_header(tmp_path):
    inc = _include()
    if inc is None or shutil.which("gcc") is None:
        pytest.skip("no cupti_activity.h (the test extra brings it) or no gcc")
    src = tmp_path / "check.c"
    src.write_text(CHECK)
    exe = tmp_path / "check"
    built = subprocess.run(["gcc", "-std=gnu11", f"-I{inc}", f"-I{REPO / 'shim' / 'records'}", "-o",
                            str(exe), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    p = subprocess.run([str(exe)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
