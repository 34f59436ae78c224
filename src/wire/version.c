/*
 * version.c - unisum_version(): the release version, from the repository's
 * VERSION file (CMake passes it as UNISUM_VERSION_STRING).  The wire
 * protocol's own version is WIRE_VERSION (wire.h).
 */
#include "unisum.h"

#ifndef UNISUM_VERSION_STRING
#define UNISUM_VERSION_STRING "unknown"
#endif

const char *unisum_version(void)
{
	return UNISUM_VERSION_STRING;
}
