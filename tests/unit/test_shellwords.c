/*
 * test_shellwords.c - --ssh-args and --srun-args split as a shell splits
 * words (tools/shellwords.c): quotes and escapes, counting without
 * touching the text, and unclosed quotes refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shellwords.h"

/* Splits `text` and compares with want[] (NULL-terminated). */
static void expect_words(const char *text, const char *const *want)
{
	char *copy = strdup(text);
	char *out[16];
	int n = 0;

	while (want[n])
		n++;
	/* Counting leaves the text as it was. */
	assert_int_equal(shellwords_split(copy, NULL), n);
	assert_string_equal(copy, text);
	assert_int_equal(shellwords_split(copy, out), n);
	for (int i = 0; i < n; i++)
		assert_string_equal(out[i], want[i]);
	free(copy);
}

static void test_plain(void **state)
{
	(void)state;
	expect_words("", (const char *const[]){ NULL });
	expect_words("  \t ", (const char *const[]){ NULL });
	expect_words("-i key -p 2222", (const char *const[]){ "-i", "key", "-p", "2222", NULL });
	expect_words(" a\t\tb\r\nc\v", (const char *const[]){ "a", "b", "c", NULL });
}

static void test_quotes(void **state)
{
	(void)state;
	expect_words("-o 'ProxyCommand ssh -W %h:%p bastion'",
		     (const char *const[]){ "-o", "ProxyCommand ssh -W %h:%p bastion", NULL });
	expect_words("--export=\"A=1 B\" x", (const char *const[]){ "--export=A=1 B", "x", NULL });
	/* Inside "...", only \" \\ \$ \` escape; elsewhere \ escapes anything. */
	expect_words("\"a\\\"b\\\\c\\n\"", (const char *const[]){ "a\"b\\c\\n", NULL });
	expect_words("a\\ b c", (const char *const[]){ "a b", "c", NULL });
	expect_words("'it'\\''s'", (const char *const[]){ "it's", NULL });
	/* An empty quoted word is a word. */
	expect_words("'' x \"\"", (const char *const[]){ "", "x", "", NULL });
	expect_words("'$HOME' \"$HOME\"", (const char *const[]){ "$HOME", "$HOME", NULL });
}

static void test_unclosed(void **state)
{
	(void)state;
	char a[] = "-o 'ProxyCommand x", b[] = "\"abc", c[] = "x \"a\\\"";

	assert_int_equal(shellwords_split(a, NULL), -1);
	assert_int_equal(shellwords_split(b, NULL), -1);
	assert_int_equal(shellwords_split(c, NULL), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_quotes),
		cmocka_unit_test(test_unclosed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
