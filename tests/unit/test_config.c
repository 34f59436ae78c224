/*
 * test_config.c - the environment parser: defaults, BytePS aliases, native
 * names winning over aliases, and errors that name the variable; machines
 * with several workers (UNISUM_WORKER_ID required), the job id, and
 * UNISUM_AUTOTUNE=auto (fit mode unless a partition size or credit is set).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "log/log.h"

static const char *const all_vars[] = {
	"UNISUM_ROLE", "DMLC_ROLE", "UNISUM_NUM_WORKER", "DMLC_NUM_WORKER", "UNISUM_NUM_SERVER",
	"DMLC_NUM_SERVER", "UNISUM_SCHEDULER_HOST", "DMLC_PS_ROOT_URI", "UNISUM_SCHEDULER_PORT",
	"DMLC_PS_ROOT_PORT", "UNISUM_WORKER_ID", "DMLC_WORKER_ID", "UNISUM_NODE_HOST", "DMLC_NODE_HOST",
	"UNISUM_PORT", "DMLC_PORT", "UNISUM_LOCAL_RANK", "BYTEPS_LOCAL_RANK", "UNISUM_LOCAL_SIZE",
	"BYTEPS_LOCAL_SIZE", "UNISUM_PARTITION_BYTES", "BYTEPS_PARTITION_BYTES",
	"UNISUM_SERVER_ENGINE_THREAD", "BYTEPS_SERVER_ENGINE_THREAD", "UNISUM_LOG_LEVEL",
	"BYTEPS_LOG_LEVEL", "UNISUM_TIMEOUT_MS", "UNISUM_JOB_ID", "UNISUM_SERVER_ID",
	"UNISUM_AUTOTUNE", "UNISUM_SCHEDULING_CREDIT", "UNISUM_SCHEDULING_CREDIT_PARTS",
	"BYTEPS_SCHEDULING_CREDIT", "UNISUM_SYNC", "UNISUM_ENABLE_ASYNC", "BYTEPS_ENABLE_ASYNC",
	"UNISUM_DSSYNC_GLOBAL_EVERY", "UNISUM_DSSYNC_CROSS_EVERY", "UNISUM_RACK",
};

static int clear_env(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
		unsetenv(all_vars[i]);
	return 0;
}

static void test_defaults(void **state)
{
	(void)state;
	struct config c;
	char err[512];
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_int_equal(c.role, CONFIG_ROLE_NONE);
	assert_int_equal(c.worker_id, -1);
	assert_true(c.partition_bytes == 4096000);
	assert_int_equal(c.local_size, 1);
	assert_int_equal(c.log_level, LOG_LEVEL_WARNING);
	assert_true(c.engine_threads >= 1);
	assert_string_equal(c.node_host, "127.0.0.1");
	/* a worker needs the scheduler's address and the job size */
	assert_int_equal(config_require(&c, CONFIG_ROLE_WORKER, err, sizeof err), UNISUM_ECONFIG);
	assert_non_null(strstr(err, "UNISUM_SCHEDULER_HOST"));
}

static void test_byteps_aliases(void **state)
{
	(void)state;
	setenv("DMLC_ROLE", "server", 1);
	setenv("DMLC_NUM_WORKER", "4", 1);
	setenv("DMLC_NUM_SERVER", "2", 1);
	setenv("DMLC_PS_ROOT_URI", "10.0.0.1", 1);
	setenv("DMLC_PS_ROOT_PORT", "1234", 1);
	setenv("BYTEPS_PARTITION_BYTES", "1024000", 1);
	setenv("BYTEPS_LOG_LEVEL", "debug", 1);
	setenv("BYTEPS_ENABLE_ASYNC", "1", 1);
	struct config c;
	char err[512];
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_string_equal(c.sync, "async");	/* BytePS's switch */
	assert_int_equal(c.role, CONFIG_ROLE_SERVER);
	assert_int_equal(c.num_workers, 4);
	assert_int_equal(c.num_servers, 2);
	assert_string_equal(c.scheduler_host, "10.0.0.1");
	assert_int_equal(c.scheduler_port, 1234);
	assert_true(c.partition_bytes == 1024000);
	assert_int_equal(c.log_level, LOG_LEVEL_DEBUG);
	assert_int_equal(config_require(&c, CONFIG_ROLE_SERVER, err, sizeof err), 0);

	/* the native name wins over the alias */
	setenv("UNISUM_NUM_WORKER", "8", 1);
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_int_equal(c.num_workers, 8);
}

/* Sets `var` to `value` and checks that loading fails naming `var`. */
static void expect_error(const char *var, const char *value)
{
	clear_env(NULL);
	setenv(var, value, 1);
	struct config c;
	char err[512] = "";
	assert_int_equal(config_load(&c, err, sizeof err), UNISUM_ECONFIG);
	if (strstr(err, var) == NULL)
		fail_msg("the error for %s='%s' does not name it: %s", var, value, err);
	unsetenv(var);
}

static void test_malformed_values_name_the_variable(void **state)
{
	(void)state;
	expect_error("UNISUM_NUM_WORKER", "two");
	expect_error("UNISUM_NUM_WORKER", "0");
	expect_error("DMLC_NUM_SERVER", "-1");
	expect_error("DMLC_PS_ROOT_PORT", "70000");
	expect_error("UNISUM_SCHEDULER_PORT", "12ab");
	expect_error("UNISUM_SCHEDULER_PORT", "");
	expect_error("DMLC_ROLE", "boss");
	expect_error("BYTEPS_PARTITION_BYTES", "4k");
	expect_error("BYTEPS_PARTITION_BYTES", "4");
	expect_error("UNISUM_PARTITION_BYTES", "99999999999999999999999");
	expect_error("BYTEPS_LOG_LEVEL", "LOUD");
	expect_error("UNISUM_TIMEOUT_MS", "1.5");
	expect_error("DMLC_PS_ROOT_URI", "");
	expect_error("BYTEPS_SERVER_ENGINE_THREAD", "9999");
	expect_error("UNISUM_AUTOTUNE", "3");
	expect_error("UNISUM_AUTOTUNE", "-1");
	expect_error("UNISUM_AUTOTUNE", "yes");
	expect_error("UNISUM_SYNC", "ssp");
	expect_error("UNISUM_SYNC", "ASYNC");
	expect_error("UNISUM_SYNC", "ssp:x");
	expect_error("UNISUM_SYNC", "ssp:99999999");
	expect_error("UNISUM_SYNC", "dssync:0");
	expect_error("UNISUM_SYNC", "dssync:");
	expect_error("UNISUM_DSSYNC_GLOBAL_EVERY", "-1");
	expect_error("UNISUM_DSSYNC_CROSS_EVERY", "x");
	expect_error("UNISUM_RACK", "-2");
	expect_error("BYTEPS_ENABLE_ASYNC", "2");

	/* cross-field checks name both variables */
	clear_env(NULL);
	setenv("UNISUM_LOCAL_RANK", "2", 1);
	setenv("UNISUM_LOCAL_SIZE", "2", 1);
	struct config c;
	char err[512];
	assert_int_equal(config_load(&c, err, sizeof err), UNISUM_ECONFIG);
	assert_non_null(strstr(err, "UNISUM_LOCAL_RANK"));
	assert_non_null(strstr(err, "UNISUM_LOCAL_SIZE"));
}

/* Sets what every role needs, for a job of `machines` machines. */
static void set_job(const char *machines)
{
	setenv("UNISUM_NUM_WORKER", machines, 1);
	setenv("UNISUM_NUM_SERVER", "1", 1);
	setenv("UNISUM_SCHEDULER_HOST", "10.0.0.1", 1);
	setenv("UNISUM_SCHEDULER_PORT", "1234", 1);
}

static void test_several_workers_per_machine_need_worker_id(void **state)
{
	(void)state;
	struct config c;
	char err[512] = "";
	set_job("2");
	setenv("BYTEPS_LOCAL_SIZE", "4", 1);
	setenv("BYTEPS_LOCAL_RANK", "3", 1);
	/* Loading works for every role: only a worker needs its machine. */
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_int_equal(c.num_workers, 2);
	assert_int_equal(c.local_size, 4);
	assert_int_equal(c.local_rank, 3);
	assert_int_equal(config_require(&c, CONFIG_ROLE_SERVER, err, sizeof err), 0);
	assert_int_equal(config_require(&c, CONFIG_ROLE_SCHEDULER, err, sizeof err), 0);
	assert_int_equal(config_require(&c, CONFIG_ROLE_WORKER, err, sizeof err), UNISUM_ECONFIG);
	if (strstr(err, "UNISUM_WORKER_ID") == NULL || strstr(err, "UNISUM_LOCAL_SIZE=4") == NULL)
		fail_msg("the error does not name UNISUM_WORKER_ID and the local size: %s", err);

	/* The machine index, by either name, is enough; it stays below the
	 * number of machines. */
	setenv("DMLC_WORKER_ID", "1", 1);
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_int_equal(c.worker_id, 1);
	assert_int_equal(config_require(&c, CONFIG_ROLE_WORKER, err, sizeof err), 0);
	setenv("UNISUM_WORKER_ID", "2", 1);
	assert_int_equal(config_load(&c, err, sizeof err), UNISUM_ECONFIG);
	assert_non_null(strstr(err, "UNISUM_WORKER_ID"));

	/* Boundary: one worker per machine may still be placed by arrival. */
	clear_env(NULL);
	set_job("2");
	setenv("UNISUM_LOCAL_SIZE", "1", 1);
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_int_equal(c.worker_id, -1);
	assert_int_equal(config_require(&c, CONFIG_ROLE_WORKER, err, sizeof err), 0);
	/* ... and two need the index. */
	setenv("UNISUM_LOCAL_SIZE", "2", 1);
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_int_equal(config_require(&c, CONFIG_ROLE_WORKER, err, sizeof err), UNISUM_ECONFIG);
}

/* Loads the environment and checks the autotune mode it resolves to, and
 * the variable that turned auto off ("" when none did). */
static void expect_autotune(int mode, int from_auto, const char *set_by)
{
	struct config c;
	char err[512];
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_int_equal(c.autotune, mode);
	assert_int_equal(c.autotune_auto, from_auto);
	assert_string_equal(c.autotune_set_by, set_by);
}

static void test_autotune_auto(void **state)
{
	(void)state;
	/* nothing set: fit mode from the configured defaults */
	expect_autotune(2, 1, "");
	setenv("UNISUM_AUTOTUNE", "AUTO", 1);
	expect_autotune(2, 1, "");
	/* a partition size or credit set by any of its names holds */
	static const char *const hand[][2] = {
		{"UNISUM_PARTITION_BYTES", "1024000"}, {"BYTEPS_PARTITION_BYTES", "131072"},
		{"UNISUM_SCHEDULING_CREDIT", "1048576"}, {"UNISUM_SCHEDULING_CREDIT_PARTS", "2"},
		{"BYTEPS_SCHEDULING_CREDIT", "8"},
	};
	for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
		clear_env(NULL);
		setenv(hand[i][0], hand[i][1], 1);
		expect_autotune(0, 1, hand[i][0]);
		/* ... unless autotune itself is asked for */
		setenv("UNISUM_AUTOTUNE", "fit", 1);
		expect_autotune(2, 0, "");
		setenv("UNISUM_AUTOTUNE", "1", 1);
		expect_autotune(1, 0, "");
	}
	/* set explicitly, by number or by name */
	static const char *const modes[][2] = {{"0", "off"}, {"1", "search"}, {"2", "fit"}};
	for (int m = 0; m < 3; m++) {
		clear_env(NULL);
		for (int form = 0; form < 2; form++) {
			setenv("UNISUM_AUTOTUNE", modes[m][form], 1);
			expect_autotune(m, 0, "");
		}
	}
}

static void test_job_id(void **state)
{
	(void)state;
	char long_id[80];
	memset(long_id, 'j', 65);
	long_id[65] = '\0';
	expect_error("UNISUM_JOB_ID", "");
	expect_error("UNISUM_JOB_ID", "job.1");
	expect_error("UNISUM_JOB_ID", "my job");
	expect_error("UNISUM_JOB_ID", "a/b");
	expect_error("UNISUM_JOB_ID", long_id);	/* 65 characters: one too many */

	struct config c;
	char err[512], id[65];
	long_id[64] = '\0';			/* 64: the longest accepted */
	setenv("UNISUM_JOB_ID", long_id, 1);
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	config_job_id(&c, id, sizeof id);
	assert_string_equal(id, long_id);
	setenv("UNISUM_JOB_ID", "run_7-B", 1);
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	config_job_id(&c, id, sizeof id);
	assert_string_equal(id, "run_7-B");
}

static void test_job_id_default(void **state)
{
	(void)state;
	struct config c;
	char err[512], id[65], again[65];
	set_job("1");
	assert_int_equal(config_load(&c, err, sizeof err), 0);
	assert_string_equal(c.job_id, "");
	config_job_id(&c, id, sizeof id);
	/* "p<port>-" and the FNV-1a hash of "10.0.0.1": pinned, because the
	 * workers of one machine must all compute this same id. */
	assert_string_equal(id, "p1234-debebe8d");
	for (const char *p = id; *p; p++)
		assert_true((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-');

	/* Stable: another load (another worker) computes the same id. */
	struct config other;
	assert_int_equal(config_load(&other, err, sizeof err), 0);
	config_job_id(&other, again, sizeof again);
	assert_string_equal(again, id);

	/* Another scheduler is another job. */
	setenv("UNISUM_SCHEDULER_HOST", "10.0.0.2", 1);
	assert_int_equal(config_load(&other, err, sizeof err), 0);
	config_job_id(&other, again, sizeof again);
	assert_string_not_equal(again, id);
	setenv("UNISUM_SCHEDULER_HOST", "10.0.0.1", 1);
	setenv("UNISUM_SCHEDULER_PORT", "1235", 1);
	assert_int_equal(config_load(&other, err, sizeof err), 0);
	config_job_id(&other, again, sizeof again);
	assert_string_equal(again, "p1235-debebe8d");

	/* A short buffer gets a truncated, terminated id. */
	char tiny[4];
	config_job_id(&c, tiny, sizeof tiny);
	assert_string_equal(tiny, "p12");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_defaults, clear_env),
		cmocka_unit_test_setup(test_byteps_aliases, clear_env),
		cmocka_unit_test_setup(test_malformed_values_name_the_variable, clear_env),
		cmocka_unit_test_setup(test_several_workers_per_machine_need_worker_id, clear_env),
		cmocka_unit_test_setup(test_autotune_auto, clear_env),
		cmocka_unit_test_setup(test_job_id, clear_env),
		cmocka_unit_test_setup(test_job_id_default, clear_env),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
