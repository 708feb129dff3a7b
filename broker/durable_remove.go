package broker

// A deleted durable queue's group removed: at run time once the deletion
// is in the metadata log (removeGroup, waitGroupRemovals), and at start-up
// the groups no queue owns any more (removeDeletedGroups).

import (
	"context"
	"fmt"
	"time"

	"github.com/warren-mq/warren/queue"
)

// removeGroup closes a deleted durable queue's group on the shard's
// worker and removes its snapshot and log (segment.RemoveGroup) once
// nothing of it is in flight and the deletion is in the metadata log, on
// the pool, so deleting queues holds
// neither memory nor disk for them. Until that is done the group stays in
// openedGrps (the start-up sweep leaves it alone). Should the removal
// fail (the engine stopped: the node is going down), the next start
// removes the group (removeDeletedGroups).
func (s *shard) removeGroup(q *Queue) {
	gid := q.grp.ID()
	s.removing++
	// Only once the metadata log holds the deletion (removeQueue added
	// it before deleteQueue ran): a crash before that brings the queue
	// back, and it must find its log.
	metaSynced := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return s.b.topo.sync(ctx, syncFor{queue: uint64(q.id)})
	}
	s.rw.Remove(q.grp, s.b.cfg.Durable.Snapshots, metaSynced, func(err error) {
		s.removing--
		delete(s.openedGrps, gid)
		if err != nil {
			s.b.log.Error("durable queue deleted: its log was not removed now; the next start removes it", queueLog(q.name), "group", gid, "err", err)
		}
		s.checkRemovals()
	})
}

// checkRemovals releases the waitGroupRemovals callers once no removal is
// in flight.
func (s *shard) checkRemovals() {
	if s.removing > 0 || len(s.removeWait) == 0 {
		return
	}
	for _, c := range s.removeWait {
		close(c)
	}
	s.removeWait = nil
}

// waitGroupRemovals waits until every shard has finished removing the
// groups of the durable queues deleted before the call.
func (b *Broker) waitGroupRemovals(ctx context.Context) error {
	for _, sh := range b.shards {
		done := make(chan struct{})
		sh.submit(Command{Kind: cmdPost, post: func() {
			sh.removeWait = append(sh.removeWait, done)
			sh.checkRemovals()
		}})
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// removeDeletedGroups removes from the log (segment.RemoveGroup) and the
// snapshot store (SnapStore.Forget) every queue group that no queue of
// the metadata owns and that no shard opened in this incarnation: the
// groups of durable queues deleted (by a client, auto-delete or expiry)
// in an earlier incarnation, or in this one when the removal at run time
// (removeGroup) did not finish before a crash or failed. Their files are
// reclaimed, and a queue that later gets the same group id (a Meta id
// reused) starts empty. It runs once, when recovery is done and before
// the listeners open, so no group it removes has a worker writing to it.
func (b *Broker) removeDeletedGroups(ctx context.Context) error {
	dc := b.cfg.Durable
	keep := map[uint64]struct{}{}
	for _, sh := range b.shards {
		done := make(chan struct{})
		sh.submit(Command{Kind: cmdPost, post: func() {
			for gid := range sh.openedGrps {
				keep[gid] = struct{}{}
			}
			close(done)
		}})
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.topo.mu.Lock()
	for id := range b.topo.queues {
		keep[queueGroup(queue.QueueRef(id))] = struct{}{}
	}
	b.topo.mu.Unlock()
	gids := dc.Log.Groups()
	for _, d := range dc.Log.Damaged() {
		gids = append(gids, d.Group) // a deleted queue's damaged copy goes too
	}
	for _, gid := range gids {
		if gid < QueueGroupBase {
			continue
		}
		if _, ok := keep[gid]; ok {
			continue
		}
		// The snapshot first: a crash between the two leaves the log, and
		// the next start removes the group again.
		if err := dc.Snapshots.Forget(gid); err != nil {
			return fmt.Errorf("broker: removing deleted queue group %d: %w", gid, err)
		}
		if err := dc.Log.RemoveGroup(gid); err != nil {
			return fmt.Errorf("broker: removing deleted queue group %d: %w", gid, err)
		}
		b.log.Info("removed the log of a deleted durable queue", "group", gid)
	}
	return nil
}
