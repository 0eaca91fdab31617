/* Rendezvous transfers: how NCCL (and MPI under LOOM_P2P=rendezvous) move a
 * schedule's messages, replayed for the verifier (verify.c).
 *
 * A send completes only once its recv is posted. Transfers between an
 * ordered pair of ranks travel on channels (one, or one per kind of message
 * when the model splits them) and meet in issue order, with no tags: the
 * k-th send on a channel delivers into the k-th recv posted on it, whatever
 * that recv expected. Each channel end is a stream that runs its groups of
 * transfers in order, and a group holds its stream until every transfer in
 * it has met its other end; the next group starts after it. Under a shared
 * stream (one stream per rank for all its transfers) a group is what was
 * queued up to a recv or a wait for a send, as a backend that batches into
 * ncclGroupStart/End at those points runs it. */
#ifndef LOOM_SCHEDULE_RENDEZVOUS_H
#define LOOM_SCHEDULE_RENDEZVOUS_H

#include <stddef.h>
#include "schedule/verify.h"

typedef struct loom_rendezvous loom_rendezvous;

/* The transfers of schedule s under `model`; arrival[msg] (the caller's,
 * -1 until then) gets the time each message's transfer completes. */
loom_rendezvous *loom_rendezvous_new(const loom_schedule *s, const loom_send_model *model, double *arrival);
void loom_rendezvous_free(loom_rendezvous *x);
/* Rank r posts the transfer of action a (a send or a recv to/from `peer`,
 * message `msg`) at time t; a send's data then takes `flight` to arrive
 * once it meets its recv. 0, or -1 with *other set when the transfer would
 * meet the wrong message: the other end's transfer in the same place on
 * the channel is message *other. A message to the rank itself is posted
 * only under a shared stream (see loom_send_model). */
int loom_rendezvous_post(loom_rendezvous *x, int r, const loom_action *a, int peer, int msg, double t, double flight,
                         int *other);
/* Rank r hands what it queued to its stream at time t (a shared stream's
 * group ends; with a stream per channel every transfer is its own group,
 * handed over as it is posted). */
void loom_rendezvous_flush(loom_rendezvous *x, int r, double t);

#endif
