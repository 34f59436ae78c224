/*
 * hostlist.h - Slurm's compressed host lists ("node[01-03,7],gpu[1-2]-ib"),
 * as in SLURM_JOB_NODELIST, expanded in order, as `scontrol show hostnames`
 * does.
 */
#ifndef UNISUM_TOOLS_HOSTLIST_H
#define UNISUM_TOOLS_HOSTLIST_H

#include <stddef.h>

/* Longest host name, and most hosts one list may expand to. */
#define HOSTLIST_NAME_MAX 255
#define HOSTLIST_HOSTS_MAX 65536

/* Calls add(arg, name) for every host of `list`, in order: hosts are
 * separated by commas; a host may hold bracketed ranges, each a comma list
 * of numbers N or ranges A-B, expanded with A's width when A has a leading
 * zero ("n[08-10]": n08 n09 n10); several brackets in one host multiply
 * ("r[1-2]n[1-2]": r1n1 r1n2 r2n1 r2n2).  Returns 0; add's negative result,
 * which stops the walk; or -1 with the reason in err (errlen bytes) when
 * the list is malformed, a name too long, or the hosts too many. */
int hostlist_expand(const char *list, int (*add)(void *arg, const char *name), void *arg,
		    char *err, size_t errlen);

#endif /* UNISUM_TOOLS_HOSTLIST_H */
