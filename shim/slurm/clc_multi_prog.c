/* SPDX-License-Identifier: Apache-2.0
 *
 * clc_multi_prog.c: slurmstepd's reading of a --multi-prog configuration (multi_prog_get_argv
 * and _in_range of src/slurmd/slurmstepd/multi_prog.c, the same from Slurm 20.11 to 25.11), up
 * to the choice of a task's line. Each rule below is one of Slurm's, kept even where it looks
 * odd, since any reading that finds no line where slurmstepd finds one lets that task run
 * without clc:
 *
 * - lines are what strtok(text, "\n") gives: empty ones do not exist, a CR stays in its line;
 * - a line that ends in a backslash hides the next one;
 * - leading white space is skipped (isspace of the C locale: slurmstepd sets no other), then a
 *   line that starts with '#' or is empty is skipped;
 * - the ranks run to the next white space; a line with nothing after them ends the search,
 *   with no program for any task;
 * - the ranks are `*` alone, or pieces between commas (empty pieces skipped): digits, or
 *   DIGITS-DIGITS with atoi's reading of each side (so "-3" is -3 to 3, "-" is 0 to 0); other
 *   pieces are ignored;
 * - the first line whose ranks hold the task is its line.
 */
#define _GNU_SOURCE /* strchrnul */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "clc_multi_prog.h"

static int c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int c_digit(char c) { return c >= '0' && c <= '9'; }

/* atoi of the digits [p, end), negated when `negative`: 0 when there are none, as atoi; -1 when
 * the value is beyond an int (atoi's value is then the low bits of strtol's, which this does not
 * guess). */
static int number(const char *p, const char *end, int negative, long long *out) {
    long long v = 0;
    for (; p < end; p++) {
        v = v * 10 + (*p - '0');
        if (v > (long long)INT_MAX + 1) return -1;
    }
    v = negative ? -v : v;
    if (v > INT_MAX || v < INT_MIN) return -1;
    *out = v;
    return 0;
}

/* Whether the ranks [spec, end) hold `task` (1), may hold it (1: a number beyond an int), or
 * not (0). */
static int in_range(const char *spec, const char *end, long long task) {
    if (end - spec == 1 && *spec == '*') return 1;
    for (const char *piece = spec; piece < end;) {
        const char *stop = memchr(piece, ',', (size_t)(end - piece));
        if (!stop) stop = end;
        const char *p = piece;
        while (p < stop && c_digit(*p)) p++;
        long long low, high;
        if (p == piece && p == stop) {
            /* an empty piece: strtok skips it */
        } else if (p == stop) {
            if (number(piece, p, 0, &low) != 0 || low == task) return 1;
        } else if (*p == '-') {
            const char *upper = p + 1, *q = upper;
            while (q < stop && c_digit(*q)) q++;
            if (q == stop) {
                /* atoi of the whole piece: its leading digits, or when it has none, the '-'
                 * and the upper bound's digits read as one negative number */
                int bad = p > piece ? number(piece, p, 0, &low) : number(upper, q, 1, &low);
                if (bad || number(upper, q, 0, &high) != 0) return 1;
                if (task >= low && task <= high) return 1;
            }
        }
        piece = stop + 1;
    }
    return 0;
}

int clc_multi_prog_line(const char *text, uint32_t task) {
    /* slurmstepd takes the task's id as an int, and finds no line for a negative one */
    if (!text || task > INT_MAX) return 0;
    int hidden = 0, number_of_line = 1;
    for (const char *line = text; *line;) {
        if (*line == '\n') {
            number_of_line++;
            line++;
            continue;
        }
        const char *end = strchrnul(line, '\n'), *p = line;
        int hides_next = end[-1] == '\\';
        while (!hidden && p < end && c_space(*p)) p++;
        if (!hidden && p < end && *p != '#') {
            const char *spec = p;
            while (p < end && !c_space(*p)) p++;
            if (p == end) return 0; /* ranks with no program: Slurm stops reading */
            if (in_range(spec, p, task)) return number_of_line;
        }
        hidden = hides_next;
        line = end;
    }
    return 0;
}
