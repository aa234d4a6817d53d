/* SPDX-License-Identifier: Apache-2.0
 *
 * green_internal.h: what green.c and green_graph.c share, inside the priority layer only.
 */
#ifndef CLC_GREEN_INTERNAL_H
#define CLC_GREEN_INTERNAL_H

#include <pthread.h>

#include "priority.h"

/* The graph tables' locks (green_graph.c), made anew in a forked child (green.c). */
extern CLC_HIDDEN pthread_mutex_t g_body_lock;
extern CLC_HIDDEN pthread_mutex_t g_node_kernel_lock;

#endif /* CLC_GREEN_INTERNAL_H */
