/*
 * shellwords.h - an option's value split into words as a shell would,
 * without expanding anything (for `unisum launch --ssh-args`, which may
 * hold "-o 'ProxyCommand ssh -W %h:%p bastion'").
 */
#ifndef UNISUM_TOOLS_SHELLWORDS_H
#define UNISUM_TOOLS_SHELLWORDS_H

/* Splits s into words: blanks (space, tab, newline, \v, \f, \r) between
 * words, '...' taken as it is, "..." with \" \\ \$ \` escapes, and \
 * escaping one character elsewhere; in place, each word's start in out[i],
 * when out is not NULL (NULL: only counts, s untouched).  Returns the
 * number of words, or -1 when a quote is not closed. */
int shellwords_split(char *s, char **out);

#endif /* UNISUM_TOOLS_SHELLWORDS_H */
