/*
 * The two calls of pvm3.h that take C varargs (pvm_packf, pvm_unpackf),
 * which Rust cannot define: linked into libpvm3.so.3 beside the Rust
 * library by scripts/build-pvm.sh. Not implemented yet (docs/pvm.md):
 * they report PvmNotImpl through the library's error path.
 */
#include <stdarg.h>

int lpvmerr(const char *f, int code);

#define PvmNotImpl (-24)

int pvm_packf(const char *fmt, ...)
{
    (void)fmt;
    return lpvmerr("pvm_packf", PvmNotImpl);
}

int pvm_unpackf(const char *fmt, ...)
{
    (void)fmt;
    return lpvmerr("pvm_unpackf", PvmNotImpl);
}
