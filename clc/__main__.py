# SPDX-License-Identifier: Apache-2.0
import sys

from clc.cli.main import main

sys.exit(main())
