/*
 * proto.c - the codecs of the rendezvous messages (layouts in rdv_proto.h):
 * one encoder and one decoder per payload, shared by the scheduler and its
 * client.  A decoder checks the shape (every field there, nothing left
 * over, strings that fit); what the values mean is the receiver's to check.
 * And the host identity that both compare (rdv_host_identity).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rendezvous/rdv_proto.h"
#include "unisum.h"

void rdv_register_encode(const struct rdv_register *m, struct wire_buf *b)
{
	wire_buf_u32(b, (uint32_t)m->role);
	wire_buf_u32(b, (uint32_t)m->req_rank);
	wire_buf_u32(b, (uint32_t)m->port);
	wire_buf_u32(b, (uint32_t)m->local_rank);
	wire_buf_u32(b, (uint32_t)m->local_size);
	wire_buf_str(b, m->host);
	wire_buf_u32(b, (uint32_t)m->pid);
	wire_buf_str(b, m->host_id);
	wire_buf_u32(b, (uint32_t)m->rack);
	wire_buf_str(b, m->transport);
	const struct rdv_resume *z = &m->resume;
	wire_buf_u32(b, z->on);
	if (!z->on)
		return;
	uint32_t head[] = {z->id, z->rank, z->gen, z->local_size, z->workers, z->servers,
			   z->joined, z->failovers, z->held};
	for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
		wire_buf_u32(b, head[i]);
	for (int g = 0; g < 4; g++) {
		wire_buf_u32(b, z->entered[g]);
		wire_buf_u32(b, z->done[g]);
	}
	wire_buf_u32(b, z->nlost);
	for (uint32_t i = 0; i < z->nlost && i < RDV_MAX_LOST; i++)
		wire_buf_u32(b, z->lost[i]);
}

/* REGISTER's resume part (after its u32 on). */
static void rdv_resume_read(struct wire_reader *r, struct rdv_resume *z)
{
	uint32_t *head[] = {&z->id, &z->rank, &z->gen, &z->local_size, &z->workers, &z->servers,
			    &z->joined, &z->failovers, &z->held};
	for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
		*head[i] = wire_read_u32(r);
	for (int g = 0; g < 4; g++) {
		z->entered[g] = wire_read_u32(r);
		z->done[g] = wire_read_u32(r);
	}
	z->nlost = wire_read_u32(r);
	if (z->nlost > RDV_MAX_LOST) {
		r->failed = true;
		return;
	}
	for (uint32_t i = 0; i < z->nlost; i++)
		z->lost[i] = wire_read_u32(r);
}

int rdv_register_decode(const void *payload, size_t len, struct rdv_register *m)
{
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	m->role = (int)wire_read_u32(&r);
	m->req_rank = (int)(int32_t)wire_read_u32(&r);
	m->port = (int)wire_read_u32(&r);
	m->local_rank = (int)wire_read_u32(&r);
	m->local_size = (int)wire_read_u32(&r);
	wire_read_str(&r, m->host, sizeof m->host);
	m->pid = (int)wire_read_u32(&r);
	wire_read_str(&r, m->host_id, sizeof m->host_id);
	m->rack = (int)(int32_t)wire_read_u32(&r);
	wire_read_str(&r, m->transport, sizeof m->transport);
	memset(&m->resume, 0, sizeof m->resume);
	m->resume.on = wire_read_u32(&r);
	if (m->resume.on == 1)
		rdv_resume_read(&r, &m->resume);
	return r.failed || r.left != 0 || m->resume.on > 1 ? UNISUM_EPROTO : 0;
}

void rdv_book_encode_head(struct wire_buf *b, uint32_t your_id, uint32_t local_size, uint32_t n)
{
	wire_buf_u32(b, your_id);
	wire_buf_u32(b, local_size);
	wire_buf_u32(b, n);
}

void rdv_book_encode_node(struct wire_buf *b, const struct rdv_node *node)
{
	wire_buf_u32(b, node->id);
	wire_buf_u32(b, (uint32_t)node->role);
	wire_buf_u32(b, (uint32_t)node->rank);
	wire_buf_u32(b, (uint32_t)node->machine);
	wire_buf_u32(b, (uint32_t)node->local_rank);
	wire_buf_u32(b, (uint32_t)node->port);
	wire_buf_str(b, node->host);
	wire_buf_u32(b, (uint32_t)node->pid);
	wire_buf_str(b, node->host_id);
	wire_buf_u32(b, (uint32_t)node->rack);
}

int rdv_book_decode(const void *payload, size_t len, uint32_t *your_id, uint32_t *local_size,
		    struct rdv_node **nodes_out, uint32_t *n_out)
{
	*nodes_out = NULL;
	*n_out = 0;
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	*your_id = wire_read_u32(&r);
	*local_size = wire_read_u32(&r);
	uint32_t n = wire_read_u32(&r);
	if (r.failed || n == 0 || n > RDV_MAX_NODES)
		return UNISUM_EPROTO;
	struct rdv_node *nodes = calloc(n, sizeof *nodes);
	if (nodes == NULL)
		return UNISUM_ENOMEM;
	for (uint32_t i = 0; i < n && !r.failed; i++) {
		struct rdv_node *node = &nodes[i];
		node->id = wire_read_u32(&r);
		node->role = (int)wire_read_u32(&r);
		node->rank = (int)wire_read_u32(&r);
		node->machine = (int)(int32_t)wire_read_u32(&r);
		node->local_rank = (int)wire_read_u32(&r);
		node->port = (int)wire_read_u32(&r);
		wire_read_str(&r, node->host, sizeof node->host);
		node->pid = (int)wire_read_u32(&r);
		wire_read_str(&r, node->host_id, sizeof node->host_id);
		node->rack = (int)(int32_t)wire_read_u32(&r);
		if (node->rack < -1)
			r.failed = true;
	}
	if (r.failed || r.left != 0) {
		free(nodes);
		return UNISUM_EPROTO;
	}
	*nodes_out = nodes;
	*n_out = n;
	return 0;
}

void rdv_declare_encode(struct wire_buf *b, const char *name, uint64_t partition_bytes,
			const struct rdv_segs *segs, const struct rdv_shape *shape, int rack,
			const char *spec)
{
	wire_buf_str(b, name);
	wire_buf_u64(b, partition_bytes);
	uint32_t n = segs != NULL ? segs->n : 0;
	wire_buf_u32(b, n);
	for (uint32_t i = 0; i < n; i++) {
		wire_buf_u64(b, segs->counts[i]);
		wire_buf_u32(b, segs->owners[i]);
	}
	uint32_t ndim = shape != NULL ? shape->ndim : 0;
	wire_buf_u32(b, ndim);
	for (uint32_t i = 0; i < ndim && i < RDV_MAX_DIMS; i++)
		wire_buf_u64(b, shape->dims[i]);
	wire_buf_u32(b, (uint32_t)rack);
	wire_buf_str(b, spec != NULL ? spec : "");
}

void rdv_segs_free(struct rdv_segs *segs)
{
	free(segs->counts);
	free(segs->owners);
	*segs = (struct rdv_segs){0};
}

int rdv_declare_decode(const void *payload, size_t len, char *name, size_t name_len,
		       uint64_t *partition_bytes, struct rdv_segs *segs, struct rdv_shape *shape,
		       int *rack, char *spec, size_t spec_len)
{
	struct wire_reader r;
	*segs = (struct rdv_segs){0};
	shape->ndim = 0;
	wire_reader_init(&r, payload, len);
	wire_read_str(&r, name, name_len);
	*partition_bytes = wire_read_u64(&r);
	uint32_t n = wire_read_u32(&r);
	if (r.failed || name[0] == '\0' || n > RDV_MAX_SEGS || r.left < (size_t)n * 12 + 4)
		return UNISUM_EPROTO;
	if (n > 0) {
		segs->counts = calloc(n, sizeof *segs->counts);
		segs->owners = calloc(n, sizeof *segs->owners);
		if (segs->counts == NULL || segs->owners == NULL) {
			rdv_segs_free(segs);
			return UNISUM_ENOMEM;
		}
		segs->n = n;
		for (uint32_t i = 0; i < n; i++) {
			segs->counts[i] = wire_read_u64(&r);
			segs->owners[i] = wire_read_u32(&r);
		}
	}
	uint32_t ndim = wire_read_u32(&r);
	if (r.failed || ndim > RDV_MAX_DIMS || r.left < (size_t)ndim * 8 + 4) {
		rdv_segs_free(segs);
		return UNISUM_EPROTO;
	}
	shape->ndim = ndim;
	for (uint32_t i = 0; i < ndim; i++)
		shape->dims[i] = wire_read_u64(&r);
	*rack = (int)(int32_t)wire_read_u32(&r);
	wire_read_str(&r, spec, spec_len);
	if (*rack < -1 || r.failed || r.left != 0) {
		rdv_segs_free(segs);
		return UNISUM_EPROTO;
	}
	return 0;
}

void rdv_placed_encode(struct wire_buf *b, uint32_t n, const struct placement_part *parts,
		       const uint32_t *servers)
{
	wire_buf_u32(b, 0);
	wire_buf_u32(b, n);
	for (uint32_t i = 0; i < n; i++) {
		wire_buf_u64(b, parts[i].count);
		wire_buf_u32(b, servers[i]);
	}
}

void rdv_refused_encode(struct wire_buf *b, int err, const char *why)
{
	wire_buf_u32(b, (uint32_t)err);
	wire_buf_str(b, why);
}

void rdv_held_encode(struct wire_buf *b, const void *req, size_t req_len, uint32_t n,
		     const struct placement_part *parts, const uint32_t *servers)
{
	wire_buf_u32(b, (uint32_t)req_len);
	wire_buf_bytes(b, req, req_len);
	rdv_placed_encode(b, n, parts, servers);
}

int rdv_held_split(const void *payload, size_t len, const void **req, size_t *req_len,
		   const void **reply, size_t *reply_len)
{
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	uint32_t n = wire_read_u32(&r);
	if (r.failed || n > r.left)
		return UNISUM_EPROTO;
	*req = r.p;
	*req_len = n;
	*reply = r.p + n;
	*reply_len = r.left - n;
	return 0;
}

int rdv_declare_reply_decode(const void *payload, size_t len, int *status, char *why, size_t why_len,
			     uint32_t *n_out, struct placement_part **parts_out, uint32_t **servers_out)
{
	*n_out = 0;
	*parts_out = NULL;
	*servers_out = NULL;
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	*status = (int)(int32_t)wire_read_u32(&r);
	if (r.failed)
		return UNISUM_EPROTO;
	if (*status != 0) {
		wire_read_str(&r, why, why_len);
		return r.failed || r.left != 0 || *status > 0 ? UNISUM_EPROTO : 0;
	}
	uint32_t n = wire_read_u32(&r);
	if (r.failed || n > PLACEMENT_MAX_PARTS || r.left != (size_t)n * 12)
		return UNISUM_EPROTO;
	if (n == 0)
		return 0;
	struct placement_part *parts = calloc(n, sizeof *parts);
	uint32_t *servers = calloc(n, sizeof *servers);
	if (parts == NULL || servers == NULL) {
		free(parts);
		free(servers);
		return UNISUM_ENOMEM;
	}
	uint64_t off = 0;
	for (uint32_t i = 0; i < n; i++) {
		parts[i].offset = off;
		parts[i].count = wire_read_u64(&r);
		servers[i] = wire_read_u32(&r);
		off += parts[i].count;
	}
	*n_out = n;
	*parts_out = parts;
	*servers_out = servers;
	return 0;
}

void rdv_tune_encode(const struct rdv_tune *t, struct wire_buf *b)
{
	wire_buf_u64(b, t->partition_bytes);
	wire_buf_u64(b, t->credit_bytes);
	wire_buf_u32(b, t->final ? 1 : 0);
	wire_buf_u32(b, t->mode);
	wire_buf_u32(b, t->steps);
}

int rdv_tune_decode(const void *payload, size_t len, uint32_t epoch, struct rdv_tune *t)
{
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	t->epoch = epoch;
	t->partition_bytes = wire_read_u64(&r);
	t->credit_bytes = wire_read_u64(&r);
	uint32_t final = wire_read_u32(&r);
	t->final = final == 1;
	t->mode = wire_read_u32(&r);
	t->steps = wire_read_u32(&r);
	if (r.failed || r.left != 0 || final > 1 || t->mode < 1 || t->mode > 2 || t->steps == 0 ||
	    t->partition_bytes < 8 ||
	    t->partition_bytes > (1ull << 30) || t->credit_bytes == 0)
		return UNISUM_EPROTO;
	return 0;
}

void rdv_failover_encode(const struct rdv_failover *f, struct wire_hdr *h, struct wire_buf *b)
{
	h->type = WIRE_FAILOVER;
	h->round = f->number;
	h->aux = (uint32_t)f->dead;
	wire_buf_u32(b, f->n);
	for (uint32_t i = 0; i < f->n; i++) {
		wire_buf_u64(b, f->keys[i]);
		wire_buf_u32(b, f->servers[i]);
	}
	h->payload_len = b->len;
}

int rdv_failover_decode(const struct wire_hdr *h, const void *payload, size_t len,
			struct rdv_failover *f)
{
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	*f = (struct rdv_failover){.number = h->round, .dead = (int)h->aux};
	uint32_t n = wire_read_u32(&r);
	if (r.failed || (uint64_t)n * 12 != r.left)
		return UNISUM_EPROTO;
	f->keys = malloc((n ? n : 1) * sizeof *f->keys);
	f->servers = malloc((n ? n : 1) * sizeof *f->servers);
	if (f->keys == NULL || f->servers == NULL) {
		free(f->keys);
		free(f->servers);
		f->keys = NULL;
		f->servers = NULL;
		return UNISUM_ENOMEM;
	}
	f->n = n;
	for (uint32_t i = 0; i < n; i++) {
		f->keys[i] = wire_read_u64(&r);
		f->servers[i] = wire_read_u32(&r);
	}
	return 0;
}

void rdv_announce_encode(const struct rdv_announce *a, struct wire_hdr *h, struct wire_buf *b)
{
	h->type = WIRE_ANNOUNCE;
	h->dtype = (uint8_t)a->dtype;
	h->count = a->count;
	h->round = a->round;
	h->aux = a->wire_op;
	h->key = a->life;
	wire_buf_str(b, a->name);
	uint32_t ndim = a->shape.ndim <= RDV_MAX_DIMS ? a->shape.ndim : 0;
	wire_buf_u32(b, ndim);
	for (uint32_t i = 0; i < ndim; i++)
		wire_buf_u64(b, a->shape.dims[i]);
	wire_buf_u64(b, a->key);
	h->payload_len = b->len;
}

int rdv_announce_decode(const struct wire_hdr *h, const void *payload, size_t len,
			struct rdv_announce *a)
{
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	wire_read_str(&r, a->name, sizeof a->name);
	uint32_t ndim = wire_read_u32(&r);
	if (r.failed || a->name[0] == '\0' || ndim > RDV_MAX_DIMS || r.left != (size_t)ndim * 8 + 8)
		return UNISUM_EPROTO;
	a->shape.ndim = ndim;
	for (uint32_t i = 0; i < ndim; i++)
		a->shape.dims[i] = wire_read_u64(&r);
	a->key = wire_read_u64(&r);
	a->dtype = (unisum_dtype)h->dtype;
	a->count = h->count;
	a->round = h->round;
	a->wire_op = h->aux;
	a->life = h->key;
	return 0;
}

/* Names this process's host for shared memory (see struct rdv_node). */
void rdv_host_identity(char *out, size_t len)
{
	char boot[64] = "?";
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (f != NULL) {
		if (fgets(boot, sizeof boot, f) == NULL)
			snprintf(boot, sizeof boot, "?");
		fclose(f);
	}
	boot[strcspn(boot, "\n")] = '\0';
	struct stat net, pid;
	unsigned long long net_ino = stat("/proc/self/ns/net", &net) == 0 ? (unsigned long long)net.st_ino : 0;
	unsigned long long pid_ino = stat("/proc/self/ns/pid", &pid) == 0 ? (unsigned long long)pid.st_ino : 0;
	snprintf(out, len, "%.36s/%llx/%llx", boot, net_ino, pid_ino);
}
