/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prog_deepbind MODE NAME: dlopens NAME (a build of lib_deepbind.c) and runs its deepbind_run(),
 * then prints the fake driver's counts. MODE: "now" (RTLD_NOW | RTLD_DEEPBIND), "lazy"
 * (RTLD_LAZY | RTLD_DEEPBIND) or "plain" (RTLD_NOW). Linked with a RUNPATH where the library
 * is, so that a bare NAME is found only through the program's own search path; built both alone
 * (the library then brings libcuda, local to it) and linked with libcuda (test_deepbind.py).
 * Prints "dlerror none" when dlopen succeeded and left no error; when it failed,
 * "dlopen failed: <dlerror>" and exits with status 2.
 */
#include "common.h"

int main(int argc, char **argv)
{
    int flags;
    start_program();
    if (argc != 3) {
        fprintf(stderr, "usage: prog_deepbind now|lazy|plain NAME\n");
        return 1;
    }
    if (strcmp(argv[1], "now") == 0)
        flags = RTLD_NOW | RTLD_DEEPBIND;
    else if (strcmp(argv[1], "lazy") == 0)
        flags = RTLD_LAZY | RTLD_DEEPBIND;
    else
        flags = RTLD_NOW;
    void *lib = dlopen(argv[2], flags);
    if (!lib) {
        const char *err = dlerror();
        printf("dlopen failed: %s\n", err ? err : "(no dlerror)");
        return 2;
    }
    const char *err = dlerror();
    printf("dlerror %s\n", err ? err : "none");
    void (*run)(void) = (void (*)(void))dlsym(lib, "deepbind_run");
    if (!run) {
        fprintf(stderr, "FAILED dlsym(deepbind_run): %s\n", dlerror());
        return 1;
    }
    run();
    print_fake_counts();
    return 0;
}
