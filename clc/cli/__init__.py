# SPDX-License-Identifier: Apache-2.0
"""The commands: `clc` (main, one module per subcommand) and `clc-run` (run)."""
