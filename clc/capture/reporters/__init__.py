# SPDX-License-Identifier: Apache-2.0
"""The report formats, one module each with one render function, as memray's reporters are:
summary (text), kernels_csv (the per-kernel CSV), json_doc (JSON), chrome (the Chrome/Perfetto
trace) and comparison (--baseline). clc.capture.reports picks one by name; the per-kernel
formats take their columns from clc.capture.columns."""
