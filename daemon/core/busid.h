/* busid: PCI bus ids parsed into numbers, so the spellings of one GPU by
 * CUDA ("0000:3B:00.0"), nvidia-smi ("00000000:3B:00.0") and sysfs
 * ("0000:3b:00.0") compare equal, and ids of different GPUs never do.
 * Pure functions; any thread. */
#ifndef KVNODE_BUSID_H
#define KVNODE_BUSID_H

#include <stdbool.h>
#include <stdint.h>

struct pci_busid {
    uint32_t domain;
    uint8_t  bus, device, function;
};

/* "DDDD:BB:dd.f": a domain of 4 to 8 hex digits, a 2-digit bus, a 2-digit
 * device (0..1f) and a 1-digit function (0..7), hex digits in either case,
 * nothing before or after. false (out untouched) for anything else,
 * including NULL, "" and the sim backend's "sim:N". */
bool busid_parse(const char *s, struct pci_busid *out);
/* <0, 0, >0 in (domain, bus, device, function) order. */
int  busid_cmp(const struct pci_busid *a, const struct pci_busid *b);
/* Both parse and name the same function. */
bool busid_same(const char *a, const char *b);

#endif
