/*
 * The two calls of pvm3.h that take C varargs, which Rust cannot define:
 * pvm_packf and pvm_unpackf, printf-like front ends to the pvm_pk* and
 * pvm_upk* calls. Linked into libpvm3.so.3 beside the Rust library by
 * scripts/build-pvm.sh.
 *
 * A conversion is  % [+] [count] [.stride] [h|l|u...] c|d|f|x|s
 *   +        (pvm_packf only) call pvm_initsend first, with the encoding
 *            given by the next argument (an int); "%+" may stand alone;
 *   count    how many items, a number or '*' (the next argument, an int);
 *            with a count the argument is a pointer to the items, without
 *            one a single value (pvm_packf) or a pointer (pvm_unpackf);
 *   .stride  a number or '*';
 *   h, l, u  short, long (or double, or double complex), unsigned;
 *   c byte, d int, f float, x complex, s string.
 * Anything outside a conversion is skipped. A bad format is PvmBadParam.
 */
#include <stdarg.h>
#include <stdlib.h>

int lpvmerr(const char *f, int code);
int pvm_initsend(int);
int pvm_pkbyte(char *, int, int), pvm_upkbyte(char *, int, int);
int pvm_pkshort(short *, int, int), pvm_upkshort(short *, int, int);
int pvm_pkushort(unsigned short *, int, int), pvm_upkushort(unsigned short *, int, int);
int pvm_pkint(int *, int, int), pvm_upkint(int *, int, int);
int pvm_pkuint(unsigned int *, int, int), pvm_upkuint(unsigned int *, int, int);
int pvm_pklong(long *, int, int), pvm_upklong(long *, int, int);
int pvm_pkulong(unsigned long *, int, int), pvm_upkulong(unsigned long *, int, int);
int pvm_pkfloat(float *, int, int), pvm_upkfloat(float *, int, int);
int pvm_pkdouble(double *, int, int), pvm_upkdouble(double *, int, int);
int pvm_pkcplx(float *, int, int), pvm_upkcplx(float *, int, int);
int pvm_pkdcplx(double *, int, int), pvm_upkdcplx(double *, int, int);
int pvm_pkstr(char *), pvm_upkstr(char *);

#define PvmBadParam (-2)

/* One conversion's size modifier. */
enum size { NORMAL, SHORT, LONG };

static int number(const char **p, va_list *ap, int *out)
{
    if (**p == '*') {
        (*p)++;
        *out = va_arg(*ap, int);
        return 1;
    }
    if (**p < '0' || **p > '9')
        return 0;
    *out = (int)strtol(*p, (char **)p, 10);
    return 1;
}

static int walk(const char *call, const char *fmt, va_list *ap, int unpack)
{
    const char *p = fmt;
    while (*p) {
        if (*p++ != '%')
            continue;
        int count = 1, stride = 1, counted = 0, unsig = 0, cc = 0;
        enum size sz = NORMAL;
        if (*p == '+') {
            p++;
            if (unpack)
                return lpvmerr(call, PvmBadParam);
            if ((cc = pvm_initsend(va_arg(*ap, int))) < 0)
                return cc;
            /* "%+" alone (as in "%+ %d") only starts the buffer. */
            if (*p == '\0' || *p == ' ' || *p == '\t' || *p == '%')
                continue;
        }
        counted = number(&p, ap, &count);
        if (*p == '.') {
            p++;
            if (!number(&p, ap, &stride))
                return lpvmerr(call, PvmBadParam);
        }
        for (;; p++) {
            if (*p == 'h')
                sz = SHORT;
            else if (*p == 'l')
                sz = LONG;
            else if (*p == 'u')
                unsig = 1;
            else
                break;
        }
        char conv = *p ? *p++ : 0;
        int byref = counted || unpack;
        if (count < 0 || stride < 1)
            return lpvmerr(call, PvmBadParam);
        switch (conv) {
        case 'c':
            if (byref) {
                char *x = va_arg(*ap, char *);
                cc = unpack ? pvm_upkbyte(x, count, stride) : pvm_pkbyte(x, count, stride);
            } else {
                char x = (char)va_arg(*ap, int);
                cc = pvm_pkbyte(&x, 1, 1);
            }
            break;
        case 'd':
            if (byref) {
                void *x = va_arg(*ap, void *);
                if (sz == SHORT)
                    cc = unsig ? (unpack ? pvm_upkushort(x, count, stride) : pvm_pkushort(x, count, stride))
                               : (unpack ? pvm_upkshort(x, count, stride) : pvm_pkshort(x, count, stride));
                else if (sz == LONG)
                    cc = unsig ? (unpack ? pvm_upkulong(x, count, stride) : pvm_pkulong(x, count, stride))
                               : (unpack ? pvm_upklong(x, count, stride) : pvm_pklong(x, count, stride));
                else
                    cc = unsig ? (unpack ? pvm_upkuint(x, count, stride) : pvm_pkuint(x, count, stride))
                               : (unpack ? pvm_upkint(x, count, stride) : pvm_pkint(x, count, stride));
            } else if (sz == SHORT) {
                short x = (short)va_arg(*ap, int);
                cc = pvm_pkshort(&x, 1, 1);
            } else if (sz == LONG) {
                long x = va_arg(*ap, long);
                cc = pvm_pklong(&x, 1, 1);
            } else {
                int x = va_arg(*ap, int);
                cc = pvm_pkint(&x, 1, 1);
            }
            break;
        case 'f':
            if (byref) {
                void *x = va_arg(*ap, void *);
                if (sz == LONG)
                    cc = unpack ? pvm_upkdouble(x, count, stride) : pvm_pkdouble(x, count, stride);
                else
                    cc = unpack ? pvm_upkfloat(x, count, stride) : pvm_pkfloat(x, count, stride);
            } else if (sz == LONG) {
                double x = va_arg(*ap, double);
                cc = pvm_pkdouble(&x, 1, 1);
            } else {
                float x = (float)va_arg(*ap, double);
                cc = pvm_pkfloat(&x, 1, 1);
            }
            break;
        case 'x': {
            /* Complex numbers go by reference, as pairs. */
            void *x = va_arg(*ap, void *);
            if (sz == LONG)
                cc = unpack ? pvm_upkdcplx(x, count, stride) : pvm_pkdcplx(x, count, stride);
            else
                cc = unpack ? pvm_upkcplx(x, count, stride) : pvm_pkcplx(x, count, stride);
            break;
        }
        case 's': {
            char *x = va_arg(*ap, char *);
            cc = unpack ? pvm_upkstr(x) : pvm_pkstr(x);
            break;
        }
        default:
            return lpvmerr(call, PvmBadParam);
        }
        if (cc < 0)
            return cc;
    }
    return 0;
}

int pvm_packf(const char *fmt, ...)
{
    va_list ap;
    if (!fmt)
        return lpvmerr("pvm_packf", PvmBadParam);
    va_start(ap, fmt);
    int cc = walk("pvm_packf", fmt, &ap, 0);
    va_end(ap);
    return cc;
}

int pvm_unpackf(const char *fmt, ...)
{
    va_list ap;
    if (!fmt)
        return lpvmerr("pvm_unpackf", PvmBadParam);
    va_start(ap, fmt);
    int cc = walk("pvm_unpackf", fmt, &ap, 1);
    va_end(ap);
    return cc;
}
