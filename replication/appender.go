package replication

// A round's writes: the submission, the appender goroutines that make the
// queued rounds durable as one segment Append (group commit, in ticket
// order), and persisted, their completion on the shard (stop when an
// Append failed).

import (
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// submission is one round's writes: one Append.
type submission struct {
	batches []segment.Batch
	groups  []*Group
	readies []raft.Ready
	hss     []raftpb.HardState // what each batch wrote as hard state (empty: none)
	hsOnly  []bool             // a hard state written for a snapshot, no Ready
	piped   []bool             // a pipelined group's write: Advanced already
	convs   [][]segment.Entry  // each batch's entries (reused; cleared once written)
	bytes   int                // the entries' data
	err     error
}

// persisted runs on the shard once the appender's Append of sub returned.
func (w *Worker) persisted(sub *submission) {
	w.stats.Persisted++
	if sub.err != nil {
		w.stop(sub.err)
		return
	}
	for i, g := range sub.groups {
		piped := sub.piped[i]
		if piped {
			g.flights--
		} else {
			g.inflight = false
		}
		if g.removed {
			g.maybeRemove()
			continue
		}
		rd := sub.readies[i]
		if piped {
			last := g.st.durable
			if n := len(rd.Entries); n > 0 {
				last = rd.Entries[n-1].Index
			}
			g.st.persisted(last, sub.hss[i])
		} else if err := g.st.appended(rd.Entries, sub.hss[i]); err != nil {
			g.fail(err)
			continue
		}
		w.mark(g)
		g.maybeCompact()
		// Committed entries that were not durable when their Ready came.
		applied := g.fsm.AppliedIndex()
		if err := g.applyWaiting(); err != nil {
			g.fail(err)
			continue
		}
		g.maybeAutoSnapshot(applied, w.now)
		if sub.hsOnly[i] || piped {
			continue // no Ready behind it, or Advanced already
		}
		held := g.held
		g.held = nil
		g.send(held)
		g.rn.Advance(rd)
	}
	clear(sub.batches)
	clear(sub.groups)
	clear(sub.readies)
	for _, c := range sub.convs {
		clear(c[:cap(c)]) // the entries' data: the bodies
	}
	*sub = submission{batches: sub.batches[:0], groups: sub.groups[:0], readies: sub.readies[:0], hss: sub.hss[:0],
		hsOnly: sub.hsOnly[:0], piped: sub.piped[:0], convs: sub.convs}
	w.free = append(w.free, sub)
}

// stop stops the worker for good after a failed write and tells Fatal.
func (w *Worker) stop(err error) {
	if w.failed == nil {
		w.failed = err
		if w.cfg.Fatal != nil {
			w.cfg.Fatal(err)
		}
	}
}

// appenders is how many appender goroutines a worker runs: two, so one
// writes while the other's fdatasync runs (segment keeps two writes in
// flight), and the disk does not wait for a write() of the next rounds.
const appenders = 2

// appender makes the rounds' writes durable and posts their completions
// back to the shard, in the order the rounds were submitted: every round
// queued since an appender's last Append goes into its next one (group
// commit: one write and one fdatasync for all of them, pipelined rounds
// of one group included). segment makes Appends durable in the order
// they took their place (a later one returns after an earlier one), and
// the tickets keep the completions in that order too.
func (w *Worker) appender() {
	defer func() {
		w.mu.Lock()
		w.running--
		last := w.running == 0
		w.mu.Unlock()
		if last {
			close(w.done)
		}
	}()
	var subs []*submission
	var batches []segment.Batch
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.closing {
			w.work.Wait()
		}
		if len(w.queue) == 0 {
			w.mu.Unlock()
			return
		}
		n, size := 0, 0
		for n < len(w.queue) && (n == 0 || size+w.queue[n].bytes <= maxMerged) {
			size += w.queue[n].bytes
			n++
		}
		subs = append(subs[:0], w.queue[:n]...)
		k := copy(w.queue, w.queue[n:])
		clear(w.queue[k:])
		w.queue = w.queue[:k]
		if k > 0 {
			w.work.Signal() // the other appender may take the rest
		}
		ticket := w.tickets
		w.tickets++
		// The Appends take their places in the log in ticket order too:
		// a group's later entries must not be written before its earlier
		// ones. An Append has its place once segment queued its batches
		// (enter), or once it returned.
		for w.entered != ticket {
			w.turns.Wait()
		}
		w.mu.Unlock()
		batches = batches[:0]
		for _, sub := range subs {
			batches = append(batches, sub.batches...)
		}
		in := false
		enter := func() {
			if !in {
				in = true
				w.mu.Lock()
				w.entered++
				w.turns.Broadcast()
				w.mu.Unlock()
			}
		}
		err := w.log.AppendThen(enter, batches...)
		enter()
		clear(batches)
		done := append([]*submission(nil), subs...)
		clear(subs)
		w.mu.Lock()
		for w.turn != ticket {
			w.turns.Wait()
		}
		w.mu.Unlock()
		w.cfg.Post(func() {
			w.stats.Merged += uint64(len(done) - 1)
			for _, sub := range done {
				sub.err = err
				w.persisted(sub)
			}
		})
		w.mu.Lock()
		w.turn++
		w.turns.Broadcast()
		w.mu.Unlock()
	}
}

// maxMerged bounds the entry bytes of the rounds the appender merges
// into one Append (segment takes at most 256 MiB in one).
const maxMerged = 64 << 20
