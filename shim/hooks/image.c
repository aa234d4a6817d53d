/* SPDX-License-Identifier: Apache-2.0
 *
 * image.c: what a loaded image is (a fatbin, the wrapper around one, a cubin ELF, PTX) and how
 * long, for the load events the capture and the engine get (load.c).
 */
#include <string.h>

#include "hooks.h"

static uint64_t elf_size(const unsigned char *p) {
    if (p[4] != 2) return 0; /* ELFCLASS64 only: cubins are */
    uint64_t phoff, shoff;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, p + 0x20, 8);
    memcpy(&shoff, p + 0x28, 8);
    memcpy(&phentsize, p + 0x36, 2);
    memcpy(&phnum, p + 0x38, 2);
    memcpy(&shentsize, p + 0x3a, 2);
    memcpy(&shnum, p + 0x3c, 2);
    uint64_t a = phoff + (uint64_t)phentsize * phnum, b = shoff + (uint64_t)shentsize * shnum;
    return a > b ? a : b;
}

/* Only the first fatbin container is sized: reading past it to look for another could touch
 * an unmapped page. */
static uint64_t fatbin_size(const unsigned char *p) {
    uint16_t hsize;
    uint64_t payload;
    memcpy(&hsize, p + 6, 2);
    memcpy(&payload, p + 8, 8);
    return hsize + payload;
}

void clc_describe_image(const void *image, clc_module_event *ev) {
    const unsigned char *p = image;
    uint32_t magic;
    if (!p) return;
    memcpy(&magic, p, 4);
    ev->image_ptr = (uint64_t)(uintptr_t)p;
    if (magic == 0x466243b1u) {
        const unsigned char *data;
        memcpy(&data, p + 8, sizeof data);
        ev->image_kind = CLC_IMAGE_FATBIN_WRAPPER;
        uint32_t inner = 0;
        if (data) memcpy(&inner, data, 4);
        ev->image_size = inner == 0xBA55ED50u ? fatbin_size(data) : 0;
    } else if (magic == 0xBA55ED50u) {
        ev->image_kind = CLC_IMAGE_FATBIN;
        ev->image_size = fatbin_size(p);
    } else if (memcmp(p, "\177ELF", 4) == 0) {
        ev->image_kind = CLC_IMAGE_ELF;
        ev->image_size = elf_size(p);
    } else {
        ev->image_kind = CLC_IMAGE_PTX;
        ev->image_size = strlen((const char *)p) + 1;
    }
}
