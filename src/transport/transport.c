/*
 * transport.c - what is the same over every transport (see transport.h).
 */
#include "transport/transport.h"

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
