/*
 * dtype.c - sizes and names of the element types (their values are part of
 * the wire protocol, see unisum.h).
 */
#include "unisum.h"

size_t unisum_dtype_size(unisum_dtype dtype)
{
	switch (dtype) {
	case UNISUM_FLOAT32:
	case UNISUM_INT32:
		return 4;
	case UNISUM_FLOAT64:
	case UNISUM_INT64:
		return 8;
	case UNISUM_FLOAT16:
	case UNISUM_BFLOAT16:
		return 2;
	default:
		return 0;
	}
}

const char *unisum_dtype_name(unisum_dtype dtype)
{
	switch (dtype) {
	case UNISUM_FLOAT32:
		return "float32";
	case UNISUM_FLOAT64:
		return "float64";
	case UNISUM_FLOAT16:
		return "float16";
	case UNISUM_BFLOAT16:
		return "bfloat16";
	case UNISUM_INT32:
		return "int32";
	case UNISUM_INT64:
		return "int64";
	default:
		return "unknown";
	}
}
