/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver (tests/native/fake_cuda.c, which includes this file in order, one
 * translation unit): modules and libraries. */

/* ---- modules and libraries ------------------------------------------------------------------- */

static CUresult module_load_image(CUmodule *module, const void *image)
{
    const char *text;
    size_t len;
    TRY(need_ctx()); /* modules belong to the current context */
    TRY(capture_unsafe());
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_cubin(image)) {
        struct entry_decl *ks;
        unsigned n;
        TRY(parse_cubin(image, &ks, &n, NULL, NULL));
        return module_from_entries(module, ks, n, 1);
    }
    TRY(image_text(image, &text, &len));
    return module_from_text(module, text, len);
}

CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    char *text;
    size_t len;
    CUresult rc;
    TRY(need_ctx());
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(read_file(fname, &text, &len));
    rc = module_from_text(module, text, len);
    free(text);
    return rc;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    return module_load_image(module, image);
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                    CUjit_option *options, void **optionValues)
{
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    return module_load_image(module, image);
}

CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return module_load_image(module, fatCubin);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    unsigned i;
    TRY(need_init());
    if (tag_of(hmod) != TAG_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < hmod->n; i++) {
        if (strcmp(hmod->funcs[i].k->name, name) == 0) {
            *hfunc = &hmod->funcs[i];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    unsigned i;
    TRY(need_init());
    lock();
    if (tag_of(hmod) != TAG_MODULE) {
        unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    hmod->tag = TAG_DEAD;
    for (i = 0; i < hmod->n; i++)
        hmod->funcs[i].tag = TAG_DEAD;
    if (!g_no_reuse) {
        hmod->next_free = g_free_modules;
        g_free_modules = hmod;
    }
    unlock();
    return CUDA_SUCCESS;
}

static CUresult library_options_ok(unsigned int numJitOptions, CUjit_option *jitOptions,
                                   void **jitOptionsValues, CUlibraryOption *libraryOptions,
                                   void **libraryOptionValues, unsigned int numLibraryOptions)
{
    unsigned i;
    if (numJitOptions && (!jitOptions || !jitOptionsValues))
        return CUDA_ERROR_INVALID_VALUE;
    if (numLibraryOptions && (!libraryOptions || !libraryOptionValues))
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < numLibraryOptions; i++)
        if ((unsigned)libraryOptions[i] >= CU_LIBRARY_NUM_OPTIONS)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Libraries are context-independent: loading one needs cuInit, not a current context. */
CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                   void **jitOptionsValues, unsigned int numJitOptions,
                                   CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                   unsigned int numLibraryOptions)
{
    const char *text;
    size_t len;
    TRY(need_init());
    TRY(capture_unsafe());
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(library_options_ok(numJitOptions, jitOptions, jitOptionsValues, libraryOptions,
                           libraryOptionValues, numLibraryOptions));
    if (is_cubin(code)) {
        if (getenv("FAKE_CUDA_REFUSE_CUBIN")) /* a driver that cannot load clc's wrapped kernels */
            return CUDA_ERROR_NOT_SUPPORTED;
        return library_from_cubin(library, code);
    }
    TRY(image_text(code, &text, &len));
    return library_from_text(library, text, len);
}

CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                       CUjit_option *jitOptions, void **jitOptionsValues,
                                       unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                       void **libraryOptionValues, unsigned int numLibraryOptions)
{
    char *text;
    size_t len;
    CUresult rc;
    TRY(need_init());
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    TRY(library_options_ok(numJitOptions, jitOptions, jitOptionsValues, libraryOptions,
                           libraryOptionValues, numLibraryOptions));
    TRY(read_file(fileName, &text, &len));
    rc = library_from_text(library, text, len);
    free(text);
    return rc;
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    unsigned i;
    TRY(need_init());
    if (tag_of(library) != TAG_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < library->n; i++) {
        if (strcmp(library->kernels[i].k->name, name) == 0) {
            *pKernel = &library->kernels[i];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    TRY(need_ctx());
    if (tag_of(library) != TAG_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    *pMod = &library->module;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library)
{
    unsigned i;
    TRY(need_init());
    lock();
    if (tag_of(library) != TAG_LIBRARY) {
        unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    library->tag = TAG_DEAD;
    library->module.tag = TAG_DEAD;
    for (i = 0; i < library->n; i++) {
        library->kernels[i].tag = TAG_DEAD;
        library->kernels[i].func.tag = TAG_DEAD;
    }
    if (!g_no_reuse && !library->n_managed) {
        library->next_free = g_free_libraries;
        g_free_libraries = library;
    }
    unlock();
    return CUDA_SUCCESS;
}

/* A managed variable of a library loaded from a cubin: its (host) buffer, zeroed at load, and
 * its size. A name the cubin does not define as managed is CUDA_ERROR_NOT_FOUND. */
CUresult CUDAAPI cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
                                     const char *name)
{
    unsigned i;
    TRY(need_init());
    if (tag_of(library) != TAG_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < library->n_managed; i++) {
        if (strcmp(library->managed[i].name, name) == 0) {
            if (dptr)
                *dptr = (CUdeviceptr)(uintptr_t)library->managed[i].data;
            if (bytes)
                *bytes = library->managed[i].size;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* The real driver returns the kernel's function in the current context. */
CUresult CUDAAPI cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pLib)
        return CUDA_ERROR_INVALID_VALUE;
    *pLib = kernel->library;
    return CUDA_SUCCESS;
}

/* A library kernel's function has no module the program could know: refused, where the real
 * driver gives an internal one. */
CUresult CUDAAPI cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION || !hfunc->module)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!hmod)
        return CUDA_ERROR_INVALID_VALUE;
    *hmod = hfunc->module;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    TRY(need_ctx());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    *pFunc = &kernel->func;
    return CUDA_SUCCESS;
}

/* Names point into the never-freed name table, so they outlive the module, as callers of the
 * real driver may assume for the module's lifetime. */
CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = hfunc->k->name;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = hfunc->k->name;
    return CUDA_SUCCESS;
}

/* A parameter's place in the buffer a launch's `extra` hands over (and the driver copies
 * kernelParams into): the layout of the function's PTX entry. An entry without a parameter list
 * has no parameters, so every index is past the end. */
static CUresult param_info(const struct CUfunc_st *f, size_t index, size_t *offset, size_t *size)
{
    if (!offset || !f->params || index >= f->params->n)
        return CUDA_ERROR_INVALID_VALUE;
    *offset = f->params->p[index].offset;
    if (size) /* optional, as in the real driver */
        *size = f->params->p[index].size;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                                      size_t *paramSize)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    return param_info(&kernel->func, paramIndex, paramOffset, paramSize);
}

static struct CUfunc_st *launchable(const void *h);

/* Like the launch entry points it also takes a CUkernel cast to a CUfunction, the handle a
 * cudart-built program launches with. */
CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                    size_t *paramSize)
{
    const struct CUfunc_st *f;
    TRY(need_init());
    if (!(f = launchable(func)))
        return CUDA_ERROR_INVALID_HANDLE;
    return param_info(f, paramIndex, paramOffset, paramSize);
}

static CUresult func_set_attr(struct CUfunc_st *f, CUfunction_attribute attrib, int value)
{
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (value < 0 || value > MAX_DYN_SMEM)
            return CUDA_ERROR_INVALID_VALUE;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        break;
    default: /* the others are read-only properties of the compiled code */
        return CUDA_ERROR_INVALID_VALUE;
    }
    f->attrs[attrib] = value;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION)
        return CUDA_ERROR_INVALID_HANDLE;
    return func_set_attr(hfunc, attrib, value);
}

CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    TRY(need_init());
    if (tag_of(hfunc) != TAG_FUNCTION)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pi || (unsigned)attrib >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = hfunc->attrs[attrib];
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                      CUdevice dev)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    return func_set_attr(&kernel->func, attrib, val);
}

CUresult CUDAAPI cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel,
                                      CUdevice dev)
{
    TRY(need_init());
    if (tag_of(kernel) != TAG_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pi || (unsigned)attrib >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = kernel->func.attrs[attrib];
    return CUDA_SUCCESS;
}

/* How many blocks of blockSize threads (and dynamicSMemSize bytes of shared memory each) fit on
 * one SM at once: min(SM_BLOCKS, SM_THREADS / blockSize, MAX_DYN_SMEM / dynamicSMemSize), a
 * rule a test can compute (registers are not counted). Takes a CUkernel cast to a CUfunction
 * too, as launches do. */
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                             int blockSize,
                                                             size_t dynamicSMemSize)
{
    const struct CUfunc_st *f;
    int n;
    TRY(need_ctx());
    if (!(f = launchable(func)))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!numBlocks || blockSize <= 0 || blockSize > (int)MAX_BLOCK_THREADS)
        return CUDA_ERROR_INVALID_VALUE;
    n = SM_THREADS / blockSize;
    if (n > SM_BLOCKS)
        n = SM_BLOCKS;
    if (dynamicSMemSize > (size_t)f->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES])
        n = 0; /* no block of this launch could run at all */
    else if (dynamicSMemSize && MAX_DYN_SMEM / dynamicSMemSize < (size_t)n)
        n = (int)(MAX_DYN_SMEM / dynamicSMemSize);
    *numBlocks = n;
    return CUDA_SUCCESS;
}
