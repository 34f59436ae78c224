/*
 * shellwords.c - splitting an option's value into words as a shell would
 * (shellwords.h), for --ssh-args and --srun-args.
 *
 * One pass serves both counting and splitting: the word is copied down
 * over its own text (quotes and escapes removed), so the write position
 * never passes the read position.
 */
#include <string.h>

#include "shellwords.h"

/* What separates words. */
#define SHELLWORDS_BLANKS " \t\n\v\f\r"

int shellwords_split(char *s, char **out)
{
	char *r = s, *w = s;
	int n = 0;

/* Puts one character of the word (only counts it without out). */
#define PUT(ch) do { if (out) *w = (ch); w++; } while (0)
	for (;;) {
		while (*r && strchr(SHELLWORDS_BLANKS, *r))
			r++;
		if (!*r)
			break;
		if (out)
			out[n] = w;
		n++;
		while (*r && !strchr(SHELLWORDS_BLANKS, *r)) {
			if (*r == '\'') {
				const char *q = strchr(r + 1, '\'');

				if (!q)
					return -1;
				for (r++; r < q; r++)
					PUT(*r);
				r++;
			} else if (*r == '"') {
				for (r++; *r && *r != '"'; r++) {
					if (*r == '\\' && r[1] && strchr("\"\\$`", r[1]))
						r++;
					PUT(*r);
				}
				if (!*r)
					return -1;
				r++;
			} else {
				if (*r == '\\' && r[1])
					r++;
				PUT(*r);
				r++;
			}
		}
		/* w <= r all along: step past the blank before ending the word. */
		if (*r)
			r++;
		PUT('\0');
	}
#undef PUT
	return n;
}
