/*
 * rdv_proto.h - payload layouts shared by the scheduler and its client.
 * (Internal to src/rendezvous.)
 *
 *   REGISTER   u32 role, u32 requested rank (int32, -1 = any; a worker's machine
 *              index), u32 port, u32 local rank, u32 local size (servers 0, 1), str host
 *   ADDRBOOK   u32 your id, u32 local size, u32 n, n x {u32 id, u32 role, u32 rank,
 *              u32 machine (int32, -1 for servers), u32 local rank, u32 port, str host}
 *   BARRIER    header aux = group; BARRIER_DONE the same
 *   DECLARE    request: header dtype, count; payload str name, u64 partition_bytes
 *              reply:   header key; payload u32 status (0 or -error),
 *                       then n x u32 server rank, or str message
 *   SHUTDOWN   worker -> scheduler: goodbye; scheduler -> server: stop now
 *   ERROR      scheduler -> node: the job failed; header key 0, aux = -error, payload str why
 *              node -> scheduler: fail the job for this reason (a stalled round or
 *              barrier); with a key (a worker): that tensor's workers disagree on
 *              its collective, poison it
 *              scheduler -> server and worker: header key = a tensor key: that
 *              tensor's workers disagree on its shape or collective and it can
 *              never be summed; payload str why
 *   RETIRE     worker -> scheduler: header key = a tensor key it undeclared; once
 *              every worker has, the scheduler forgets the tensor
 *   TUNE       worker 0 -> scheduler -> every worker: header round = epoch; payload
 *              u64 partition_bytes (8 .. 1 GiB), u64 credit_bytes (> 0), u32 final (0/1)
 */
#ifndef UNISUM_RDV_PROTO_H
#define UNISUM_RDV_PROTO_H

#define RDV_MAX_NODES 4096
#define RDV_MAX_LOCAL_SIZE 1024	/* UNISUM_LOCAL_SIZE's upper bound */

#endif /* UNISUM_RDV_PROTO_H */
