/* busid: see busid.h. */
#include "core/busid.h"

#include <stddef.h>

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Exactly min..max hex digits at *p (advanced past them). */
static bool hex_field(const char **p, int min, int max, uint32_t *out)
{
    uint32_t v = 0;
    int n = 0, d;

    while (n < max && (d = hex_digit((*p)[n])) >= 0) {
        v = v << 4 | (uint32_t)d;
        n++;
    }
    if (n < min || hex_digit((*p)[n]) >= 0)
        return false;
    *p += n;
    *out = v;
    return true;
}

bool busid_parse(const char *s, struct pci_busid *out)
{
    uint32_t dom, bus, dev, fn;

    if (!s || !hex_field(&s, 4, 8, &dom) || *s++ != ':' || !hex_field(&s, 2, 2, &bus) ||
        *s++ != ':' || !hex_field(&s, 2, 2, &dev) || *s++ != '.' || !hex_field(&s, 1, 1, &fn) ||
        *s != '\0' || dev > 0x1f || fn > 7)
        return false;
    out->domain = dom;
    out->bus = (uint8_t)bus;
    out->device = (uint8_t)dev;
    out->function = (uint8_t)fn;
    return true;
}

int busid_cmp(const struct pci_busid *a, const struct pci_busid *b)
{
    if (a->domain != b->domain)
        return a->domain < b->domain ? -1 : 1;
    if (a->bus != b->bus)
        return a->bus < b->bus ? -1 : 1;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    if (a->function != b->function)
        return a->function < b->function ? -1 : 1;
    return 0;
}

bool busid_same(const char *a, const char *b)
{
    struct pci_busid x, y;
    return busid_parse(a, &x) && busid_parse(b, &y) && busid_cmp(&x, &y) == 0;
}
