# SPDX-License-Identifier: Apache-2.0
"""Capture files: reading them (reader) and what `clc report` and clc-run's summary make of
them (reports: the summary table, JSON and the chrome trace)."""
