# SPDX-License-Identifier: Apache-2.0
"""Capture files: reading them (reader, over records, model, counts and launches) and what
`clc report` and clc-run's summary make of them (reports: rows, one column table, and one
reporter module per format in reporters/); clc metrics counts them (metrics)."""
