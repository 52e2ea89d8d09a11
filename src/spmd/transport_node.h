/*
 * transport_node.h - small messages between the processes of one machine
 * through memory they share, under transport.c (private to it).
 *
 * MPI-3 lets the processes of one node share memory: MPI_Comm_split_type
 * (MPI_COMM_TYPE_SHARED) gives the node's processes, MPI_Win_allocate_shared
 * a window each of them reads and writes directly.  Each process's part of
 * the window holds one ring per other process of its node: bytes that
 * process writes (the producer) and this one reads (the consumer), with a
 * head and a tail counter on cache lines of their own.  A small message
 * (a collective's header, an exit record, the end of a call, a BYE) to a
 * process of the same node is a record copied into the ring and a store
 * of the tail: ~100 instructions where MPI's point-to-point costs ~1,500
 * per message (request, matching, its locks under MPI_THREAD_MULTIPLE), and
 * on a machine with fewer cores than processes that work is what a
 * one-float collective's latency is made of (README, the MPI benchmark).
 * Data messages (operands) stay on MPI, which moves large buffers once.
 *
 * Order.  One sender's small messages must reach the mailbox in the order
 * sent, also relative to the messages it sends by MPI (data, or a small
 * message too long for a ring).  Each record is stamped with the number of
 * MPI messages its sender had sent to the receiver before it
 * (node_mpi_sent); the receiver counts the MPI messages it matched from
 * each sender (node_mpi_matched) and takes a record out of the ring only
 * once it has matched that many, and takes what the ring holds of a sender
 * before it keeps an MPI message from it (transport.c's poll).
 *
 * A full ring never blocks a sender: the record waits in a queue of the
 * sender's (and so does every later one to that process, keeping the
 * order), moved into the ring by later sends and polls; what is still
 * queued when the sender sends that process an MPI message goes by MPI
 * ahead of it (node_send_mpi).  node_close makes
 * every process's queue empty before the window goes.
 *
 * Threads: the producer side of each ring is guarded by a mutex per
 * destination (in this process's memory), the consumer side by the
 * caller's lock (transport.c's mailbox lock, held for node_drain); the
 * counters between processes are C11 atomics (lock-free, so address-free).
 */
#ifndef SHMAP_TRANSPORT_NODE_H
#define SHMAP_TRANSPORT_NODE_H

#ifdef HAVE_MPI
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include "spmd/transport.h"

/* The longest message a ring carries; longer ones go by MPI. */
#define NODE_MSG_MAX 8192

/* Opens the rings between this process (one of [nprocs] in
 * MPI_COMM_WORLD) and the other processes of its node [node] (its
 * communicator of MPI_COMM_TYPE_SHARED, owned from here on and freed by
 * node_close).  Collective over [node].  False when there is no other
 * process on the node or the window cannot be had, on every process of
 * the node alike (then every message goes by MPI). */
bool node_open(MPI_Comm node, int nprocs);

/* The longest message the rings carry (NODE_MSG_MAX, less with
 * SHMAP_TEST_RING_BYTES): a longer one goes by MPI. */
size_t node_msg_max(void);

/* Whether messages to (and from) process [proc] go through a ring. */
bool node_reaches(int proc);

/* Sends a message to process [proc] (node_reaches) by MPI, in order with
 * the records to it: under the lock of [proc]'s ring, moves the records
 * queued for it into the ring while there is room and sends those left by
 * MPI ahead of the message (spill(proc, tag, data, len) each: a small
 * send that must not fail), then calls send(arg); each MPI message is
 * counted, so the next record to [proc] waits behind it at the receiver.
 * (A record left in the queue behind an MPI message would reach the
 * receiver after it: the receiver takes a sender's ring before an MPI
 * message from it, and the record was not in the ring yet.)  Returns what
 * send returned.  Neither callback may take the mailbox's lock. */
void *node_send_mpi(int proc, void (*spill)(int, int, const char *, size_t),
                    void *(*send)(void *), void *arg);

/* Counts a message from process [source] matched by MPI (caller's lock). */
void node_mpi_matched(int source);

/* Sends the [total] bytes of [iov] (at most node_msg_max()) to process
 * [proc] (node_reaches) with [tag]: into its ring, or queued behind what
 * waits for room.  False when out of memory for the queue. */
bool node_send(int proc, int tag, const TransportIov *iov, int niov, size_t total);

/* Gives each message the rings hold, in each sender's order, to
 * deliver(source, tag, data, len, arg) (which copies it), stopping at a
 * sender's record whose MPI predecessors have not been matched yet; then
 * moves queued records into rings with room.  With [source] >= 0 only that
 * sender's ring.  Caller's lock (the mailbox's) held. */
void node_drain(int source, void (*deliver)(int, int, const char *, size_t, void *),
                void *arg);

/* Whether records wait in this process's queues (node_drain moves them). */
bool node_queued(void);

/* Closes the rings: once every process of the node has its queues empty
 * (draining meanwhile with [deliver], whose messages the caller drops),
 * frees the window.  Collective over the node. */
void node_close(void (*deliver)(int, int, const char *, size_t, void *), void *arg);

#endif
#endif
