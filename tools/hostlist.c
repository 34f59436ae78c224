/*
 * hostlist.c - expanding Slurm's compressed host lists (hostlist.h).
 *
 * A host is expanded by recursion over its brackets: the text before the
 * first '[' is appended to the name built so far, then each number of the
 * bracket in turn, and the rest of the host expanded after it.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hostlist.h"

struct walk {
	int (*add)(void *arg, const char *name);
	void *arg;
	long count;
	char *err;
	size_t errlen;
	const char *list;
};

static int fail(struct walk *w, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(w->err, w->errlen, "host list '%.64s%s': ", w->list,
			 strlen(w->list) > 64 ? "..." : "");

	if (n >= 0 && (size_t)n < w->errlen) {
		va_start(ap, fmt);
		vsnprintf(w->err + n, w->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* Reads a number of 1 to 9 digits at *p into *v, its length (leading
 * zeros too) into *width. */
static bool number(const char **p, const char *end, long *v, int *width)
{
	const char *s = *p;

	*v = 0;
	while (*p < end && isdigit((unsigned char)**p) && *p - s < 9)
		*v = *v * 10 + (**p - '0'), (*p)++;
	*width = (int)(*p - s);
	return *width > 0 && !(*p < end && isdigit((unsigned char)**p));
}

/* Expands host text [s, end) after `name` (len bytes built so far). */
static int expand(struct walk *w, const char *s, const char *end, char *name, size_t len)
{
	const char *open = memchr(s, '[', (size_t)(end - s));
	const char *stop = open ? open : end;
	const char *close;

	if (memchr(s, ']', (size_t)(stop - s)))
		return fail(w, "']' without '['");
	if (len + (size_t)(stop - s) > HOSTLIST_NAME_MAX)
		return fail(w, "a host name is longer than %d characters", HOSTLIST_NAME_MAX);
	memcpy(name + len, s, (size_t)(stop - s));
	len += (size_t)(stop - s);
	if (!open) {
		if (len == 0)
			return fail(w, "an empty host name");
		if (++w->count > HOSTLIST_HOSTS_MAX)
			return fail(w, "more than %d hosts", HOSTLIST_HOSTS_MAX);
		name[len] = '\0';
		return w->add(w->arg, name);
	}
	close = memchr(open, ']', (size_t)(end - open));
	if (!close)
		return fail(w, "'[' without ']'");
	if (memchr(open + 1, '[', (size_t)(close - open - 1)))
		return fail(w, "brackets inside brackets");
	for (const char *p = open + 1;;) {
		long lo, hi;
		int wlo, whi, width;

		if (!number(&p, close, &lo, &wlo))
			return fail(w, "a range needs numbers (of at most 9 digits)");
		hi = lo;
		if (p < close && *p == '-') {
			p++;
			if (!number(&p, close, &hi, &whi))
				return fail(w, "a range needs numbers (of at most 9 digits)");
			if (hi < lo)
				return fail(w, "range %ld-%ld runs backwards", lo, hi);
		}
		if (p < close && *p != ',')
			return fail(w, "'%c' inside brackets", *p);
		/* The first number's width: "08-10" gives 08 09 10. */
		width = wlo;
		for (long v = lo; v <= hi; v++) {
			char num[16];
			int n = snprintf(num, sizeof(num), "%0*ld", width, v);

			if (len + (size_t)n > HOSTLIST_NAME_MAX)
				return fail(w, "a host name is longer than %d characters",
					    HOSTLIST_NAME_MAX);
			memcpy(name + len, num, (size_t)n);
			int rc = expand(w, close + 1, end, name, len + (size_t)n);
			if (rc < 0)
				return rc;
		}
		if (p == close)
			break;
		p++;	/* the comma */
	}
	return 0;
}

int hostlist_expand(const char *list, int (*add)(void *arg, const char *name), void *arg,
		    char *err, size_t errlen)
{
	struct walk w = { .add = add, .arg = arg, .err = err, .errlen = errlen, .list = list };
	char name[HOSTLIST_NAME_MAX + 1];
	const char *s = list;

	if (errlen > 0)
		err[0] = '\0';
	for (;;) {
		/* The host ends at the first comma outside brackets. */
		const char *e = s;
		bool in = false;

		while (*e && (in || *e != ',')) {
			if (*e == '[')
				in = true;
			else if (*e == ']')
				in = false;
			e++;
		}
		if (e == s)
			return fail(&w, *s ? "an empty host name" : s == list ? "no host" :
				    "it ends with a comma");
		int rc = expand(&w, s, e, name, 0);
		if (rc < 0)
			return rc;
		if (!*e)
			return 0;
		s = e + 1;
	}
}
