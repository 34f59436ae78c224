/*
 * fuzz_check.h - CHECK(cond) for the fuzz harnesses: a broken invariant is
 * reported with its place and aborts, so libFuzzer saves the input.
 */
#ifndef UNISUM_FUZZ_CHECK_H
#define UNISUM_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static inline void check_failed(const char *what, const char *file, int line)
{
	fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
	abort();
}

#define CHECK(cond)                                              \
	do {                                                     \
		if (!(cond))                                     \
			check_failed(#cond, __FILE__, __LINE__); \
	} while (0)

#endif /* UNISUM_FUZZ_CHECK_H */
