/*
 * strerror.c - the text of every public error code.
 */
#include "log/log.h"
#include "unisum.h"

const char *unisum_strerror(int err)
{
	switch (err) {
	case UNISUM_OK:
		return "success";
	case UNISUM_EINVAL:
		return "invalid argument";
	case UNISUM_ENOMEM:
		return "out of memory";
	case UNISUM_ECONFIG:
		return "an environment variable is missing or malformed";
	case UNISUM_ENOTINIT:
		return "unisum_init() has not been called";
	case UNISUM_EMISMATCH:
		return "workers disagree on a tensor's dtype, size or collective";
	case UNISUM_ECONN:
		return "a connection to a peer failed or was closed";
	case UNISUM_EPROTO:
		return "a peer broke the protocol";
	case UNISUM_ETIMEDOUT:
		return "timed out";
	case UNISUM_EBUSY:
		return "busy: the tensor already has a push_pull in flight, or a shared segment of that name is in use";
	case UNISUM_EREMOTE:
		return "a peer reported an error";
	case UNISUM_ESYS:
		return "a system call failed";
	case UNISUM_ESHUTDOWN:
		return "the job is shutting down";
	case UNISUM_EAUTH:
		return "a peer failed the handshake of the job secret";
	case UNISUM_EMEMBERSHIP:
		return "the job's workers changed: call unisum_rejoin()";
	default:
		return "unknown error";
	}
}

int log_known_error(int code, int fallback)
{
	return code < 0 && code >= UNISUM_EMEMBERSHIP ? code : fallback;
}

const char *unisum_last_error(void)
{
	return log_last_error();
}
