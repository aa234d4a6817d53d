/* SPDX-License-Identifier: Apache-2.0
 *
 * entry.h: the entry layer of stage 1 (shim/entry/: interpose.c dlopen.c), the top of the
 * preload library: the symbols handed to the program and its dlopen/dlsym.
 *
 * Each layer of stage 1 is a folder of shim/, named in shim/LAYERS lowest first, with a header
 * of its own name that includes the one below it; each file includes its own layer's.
 */
#ifndef CLC_ENTRY_H
#define CLC_ENTRY_H

#include "hooks/hooks.h"

#endif /* CLC_ENTRY_H */
