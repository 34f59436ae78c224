/*
 * test_hostlist.c - Slurm's compressed host lists (tools/hostlist.c), as
 * `unisum launch --slurm` reads SLURM_JOB_NODELIST: each expansion as
 * `scontrol show hostnames` (Slurm 22.05) prints it, and text after a
 * bracket, which that version refuses and later ones take; each malformed
 * list refused with its reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hostlist.h"

/* The hosts joined by spaces. */
struct joined {
	char text[4096];
	int count;
	int stop_at;	/* add() fails at this host (1-based), 0 = never */
};

static int add(void *arg, const char *name)
{
	struct joined *j = arg;
	size_t len = strlen(j->text);

	j->count++;
	if (j->stop_at && j->count == j->stop_at)
		return -7;
	snprintf(j->text + len, sizeof(j->text) - len, "%s%s", len ? " " : "", name);
	return 0;
}

static void expect_hosts(const char *list, const char *want)
{
	struct joined j = { 0 };
	char err[256];

	assert_int_equal(hostlist_expand(list, add, &j, err, sizeof(err)), 0);
	assert_string_equal(j.text, want);
	assert_string_equal(err, "");
}

static void expect_refused(const char *list, const char *reason)
{
	struct joined j = { 0 };
	char err[256];

	assert_int_equal(hostlist_expand(list, add, &j, err, sizeof(err)), -1);
	if (!strstr(err, reason))
		fail_msg("'%s': '%s' does not say '%s'", list, err, reason);
	assert_true(strncmp(err, "host list '", 11) == 0);
	assert_true(strncmp(err + 11, list, strlen(list) > 64 ? 64 : strlen(list)) == 0);
}

static void test_plain(void **state)
{
	(void)state;
	expect_hosts("node1", "node1");
	expect_hosts("a,b,c", "a b c");
	expect_hosts("gpu-a.example.org", "gpu-a.example.org");
}

static void test_ranges(void **state)
{
	(void)state;
	expect_hosts("node[0-2]", "node0 node1 node2");
	expect_hosts("node[1,3,5-6]", "node1 node3 node5 node6");
	expect_hosts("n[8-11]", "n8 n9 n10 n11");
	/* The first number's width pads every number. */
	expect_hosts("n[08-11]", "n08 n09 n10 n11");
	expect_hosts("n[001-002,10]", "n001 n002 n10");
	expect_hosts("n[7]", "n7");
	/* Text after a bracket, several hosts, several brackets. */
	expect_hosts("gpu[1-2]-ib,cpu9", "gpu1-ib gpu2-ib cpu9");
	expect_hosts("a[1-2],b[3,4],c", "a1 a2 b3 b4 c");
	expect_hosts("r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2");
	expect_hosts("[1-2]x", "1x 2x");
}

static void test_malformed(void **state)
{
	(void)state;
	expect_refused("", "no host");
	expect_refused("a,", "ends with a comma");
	expect_refused("a,,b", "empty host name");
	expect_refused("n[1-2", "'[' without ']'");
	expect_refused("n1-2]", "']' without '['");
	expect_refused("n[2-1]", "runs backwards");
	expect_refused("n[a-b]", "needs numbers");
	expect_refused("n[1-]", "needs numbers");
	expect_refused("n[]", "needs numbers");
	expect_refused("n[1;2]", "';' inside brackets");
	expect_refused("n[[1]]", "brackets inside brackets");
	expect_refused("n[1-1234567890]", "at most 9 digits");
	/* Leading zeros count: a width past 9 would not fit a number's text. */
	expect_refused("n[0000000000000000000000000001]", "at most 9 digits");
	expect_hosts("n[000000001-000000002]", "n000000001 n000000002");
	expect_refused("n[0-99999]x[0-9]", "more than 65536 hosts");
	char longname[300];
	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	expect_refused(longname, "longer than 255");
}

/* add()'s failure stops the walk and is returned as it is. */
static void test_add_fails(void **state)
{
	(void)state;
	struct joined j = { .stop_at = 2 };
	char err[64];

	assert_int_equal(hostlist_expand("n[1-5]", add, &j, err, sizeof(err)), -7);
	assert_int_equal(j.count, 2);
	assert_string_equal(j.text, "n1");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_ranges),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_add_fails),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
