/*
 * transport.c - what is the same over every transport (see transport.h).
 */
#include "transport/transport.h"

#include <stdio.h>
#include <string.h>

#include "log/log.h"

int transport_connect(const struct transport_ops *tp, const char *host, int port, int timeout_ms,
		      struct tp_conn **out)
{
	struct tp_conn *c;
	int rc = tp->dial(host, port, timeout_ms, &c);
	if (rc != 0)
		return rc;
	char why[256];
	rc = tp->authenticate(c, true, why, sizeof why);
	if (rc != 0) {
		tp->conn_free(c);
		return log_fail(rc, "%s", why);
	}
	*out = c;
	return 0;
}

#ifndef UNISUM_HAVE_UCX
const struct transport_ops *transport_ucx(char *why, size_t len)
{
	snprintf(why, len, "this build of unisum has no UCX transport (it was built without "
		 "UCX's headers: Debian's libucx-dev)");
	return NULL;
}
#endif

const struct transport_ops *transport_named(const char *name, char *why, size_t len)
{
	if (strcmp(name, "tcp") == 0 || name[0] == '\0')	/* "": a configuration not loaded */
		return transport_tcp();
	if (strcmp(name, "ucx") != 0) {
		snprintf(why, len, "UNISUM_TRANSPORT='%s' must be tcp or ucx", name);
		return NULL;
	}
	char because[400];
	const struct transport_ops *tp = transport_ucx(because, sizeof because);
	if (tp == NULL)
		snprintf(why, len, "UNISUM_TRANSPORT=ucx: %s", because);
	return tp;
}

void transport_mem_register(const struct transport_ops *tp, void *p, size_t len)
{
	if (tp != NULL && tp->mem_register != NULL && p != NULL && len > 0)
		tp->mem_register(p, len);
}

void transport_mem_unregister(const struct transport_ops *tp, void *p)
{
	if (tp != NULL && tp->mem_unregister != NULL && p != NULL)
		tp->mem_unregister(p);
}

int transport_lent_settle(const struct transport_ops *tp, int timeout_ms)
{
	return tp != NULL && tp->lent_settle != NULL ? tp->lent_settle(timeout_ms) : 0;
}
