/*
 * client_book.c - the address book as a node sees it: its own id and
 * rank, the job's shape, and the entries of the other nodes (the book
 * the scheduler sent at registration; a REJOIN replaces one entry).
 */
#include <string.h>

#include "config/config.h"
#include "rendezvous/client_int.h"

uint32_t rdv_client_id(const struct rdv_client *c)
{
	return c->id;
}

int rdv_client_rank(const struct rdv_client *c)
{
	return c->rank;
}

int rdv_client_local_size(const struct rdv_client *c)
{
	return c->local_size;
}

int rdv_client_num_servers(const struct rdv_client *c)
{
	return c->num_servers;
}

int rdv_client_num_machines(const struct rdv_client *c)
{
	return c->num_machines;
}

const struct rdv_node *rdv_client_nodes(const struct rdv_client *c, int *count)
{
	*count = c->nnodes;
	return c->nodes;
}

const struct rdv_node *rdv_client_server(const struct rdv_client *c, int server_rank)
{
	for (int i = 0; i < c->nnodes; i++)
		if (c->nodes[i].role == CONFIG_ROLE_SERVER && c->nodes[i].rank == server_rank)
			return &c->nodes[i];
	return NULL;
}

const struct rdv_node *rdv_client_worker(const struct rdv_client *c, int rank)
{
	for (int i = 0; i < c->nnodes; i++)
		if (c->nodes[i].role == CONFIG_ROLE_WORKER && c->nodes[i].rank == rank)
			return &c->nodes[i];
	return NULL;
}

const struct rdv_node *rdv_client_node_by_id(const struct rdv_client *c, uint32_t id)
{
	for (int i = 0; i < c->nnodes; i++)
		if (c->nodes[i].id == id)
			return &c->nodes[i];
	return NULL;
}

bool rdv_client_same_host(const struct rdv_client *c, const struct rdv_node *n)
{
	const struct rdv_node *me = rdv_client_node_by_id(c, c->id);
	return me != NULL && n->pid > 0 && strcmp(me->host_id, n->host_id) == 0;
}
