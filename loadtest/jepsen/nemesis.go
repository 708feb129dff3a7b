package jepsen

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/warren-mq/warren/loadtest/faultnet"
)

// nemesis applies one class of fault, again and again, for a while.
type nemesis struct {
	cfg   *Config
	cl    *cluster
	c     *clients
	r     *rand.Rand
	res   *Result
	class string
}

func (nm *nemesis) pick() *node { return nm.cl.nodes[nm.r.IntN(len(nm.cl.nodes))] }

func (nm *nemesis) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (nm *nemesis) note(format string, args ...any) {
	nm.res.Notes = append(nm.res.Notes, fmt.Sprintf(format, args...))
}

func (nm *nemesis) fail(format string, args ...any) {
	nm.res.Failed = append(nm.res.Failed, fmt.Sprintf(format, args...))
}

// run applies faults until d has passed: a quiet spell of load, the
// fault, then the wait until every client moves again (the recovery time,
// from the fault's start).
func (nm *nemesis) run(ctx context.Context, d time.Duration) {
	end := time.Now().Add(d)
	nm.sleep(ctx, time.Duration(300+nm.r.IntN(500))*time.Millisecond)
	for ctx.Err() == nil && time.Now().Before(end) {
		for _, n := range nm.cl.nodes {
			if _, unexpected := n.running(); unexpected != nil {
				nm.fail("%v", unexpected)
				if err := n.start(ctx, 60*time.Second); err != nil {
					nm.fail("restarting it: %v", err)
					return
				}
			}
		}
		start := time.Now()
		if err := nm.fault(ctx); err != nil {
			nm.fail("%v", err)
			return
		}
		nm.res.Events++
		if rec, ok := nm.recovered(ctx, start, 30*time.Second); ok {
			nm.res.Recovery = append(nm.res.Recovery, rec)
		} else {
			nm.fail("event %d: the clients did not all move again within 30 s", nm.res.Events)
		}
		nm.sleep(ctx, time.Duration(200+nm.r.IntN(800))*time.Millisecond)
	}
}

// recovered waits until every producer had a confirm and every consumer
// a delivery after since.
func (nm *nemesis) recovered(ctx context.Context, since time.Time, limit time.Duration) (time.Duration, bool) {
	deadline := since.Add(limit)
	s := since.UnixNano()
	for ctx.Err() == nil && time.Now().Before(deadline) {
		all := true
		last := int64(0)
		for i := range nm.c.lastConfirm {
			v := nm.c.lastConfirm[i].Load()
			all = all && v > s
			last = max(last, v)
		}
		for i := range nm.cfg.Consumers {
			v := nm.c.lastDeliver[i].Load()
			all = all && v > s
			last = max(last, v)
		}
		if all {
			return time.Duration(last - s), true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, false
}

func (nm *nemesis) fault(ctx context.Context) error {
	switch nm.class {
	case "kill", "powerloss":
		n := nm.pick()
		n.kill()
		nm.sleep(ctx, time.Duration(nm.r.IntN(300))*time.Millisecond)
		return n.start(ctx, 60*time.Second)
	case "pause":
		n := nm.pick()
		n.signal(syscall.SIGSTOP)
		nm.sleep(ctx, time.Duration(1000+nm.r.IntN(1500))*time.Millisecond)
		n.signal(syscall.SIGCONT)
		return nil
	case "bitflip", "truncate":
		return nm.damage(ctx, nm.pick())
	case "restart":
		// A rolling restart: every node in turn stopped gracefully (its
		// leaderships handed off) and started again once the one before
		// serves.
		for _, n := range nm.cl.nodes {
			if !n.stop(20 * time.Second) {
				nm.fail("event %d: node %d did not stop within 20 s of SIGTERM (killed)", nm.res.Events+1, n.id)
			}
			if err := n.start(ctx, 60*time.Second); err != nil {
				return err
			}
		}
		return nil
	case "kill-leader":
		// kill -9 the node leading the first queue, as the admin API names
		// it: a leader killed again and again.
		n := nm.pick()
		if u, err := nm.cl.leader(ctx, nm.c.queues[0]); err == nil {
			for _, m := range nm.cl.nodes {
				if m.url() == u {
					n = m
				}
			}
		} else {
			nm.note("event %d: no leader named (%v); killed node %d", nm.res.Events+1, err, n.id)
		}
		n.kill()
		nm.sleep(ctx, time.Duration(nm.r.IntN(300))*time.Millisecond)
		return n.start(ctx, 60*time.Second)
	case "membership":
		// A membership change under load: a running node decommissioned
		// (its replicas move off while it serves, then it is removed and
		// stops by itself), then a new, empty node joins in its place and
		// gets replicas back (rebuild waits for every queue's count).
		n := nm.pick()
		var via *node
		for _, m := range nm.cl.nodes {
			if up, _ := m.running(); up && m != n {
				via = m
				break
			}
		}
		if via == nil {
			return fmt.Errorf("jepsen: no other node running to decommission node %d through", n.id)
		}
		ev := nm.res.Events + 1
		n.mu.Lock()
		n.expectEnd = true // a removed node stops by itself
		n.mu.Unlock()
		if err := via.post(ctx, "/api/cluster/decommission", map[string]any{"node_id": n.id}); err != nil {
			return fmt.Errorf("jepsen: event %d: decommissioning node %d: %w", ev, n.id, err)
		}
		if !n.end(0, 30*time.Second) {
			nm.fail("event %d: node %d, decommissioned, still ran 30 s later (killed)", ev, n.id)
		}
		return nm.rebuild(ctx, n, ev)
	case "delay":
		// Every link between the nodes slow for a while: 20-100 ms each
		// way, with as much jitter again.
		d := time.Duration(20+nm.r.IntN(80)) * time.Millisecond
		nm.cl.net.Each(func(_, _ int, p *faultnet.Proxy) { p.SetDelay(d, d) })
		nm.sleep(ctx, time.Duration(2000+nm.r.IntN(2000))*time.Millisecond)
		nm.cl.net.Each(func(_, _ int, p *faultnet.Proxy) { p.SetDelay(0, 0) })
		return nil
	case "drop":
		// Every connection between the nodes reset at once (the nodes
		// redial).
		nm.cl.net.Each(func(_, _ int, p *faultnet.Proxy) { p.Reset() })
		return nil
	case "partition":
		n := nm.pick()
		nm.cl.net.Isolate(n.id)
		nm.sleep(ctx, time.Duration(1000+nm.r.IntN(3000))*time.Millisecond)
		nm.cl.net.Heal()
		return nil
	case "partition-oneway":
		a := nm.pick()
		b := nm.pick()
		for b == a {
			b = nm.pick()
		}
		nm.cl.net.Cut(a.id, b.id)
		nm.sleep(ctx, time.Duration(1000+nm.r.IntN(3000))*time.Millisecond)
		nm.cl.net.Heal()
		return nil
	}
	return fmt.Errorf("jepsen: no nemesis for %q", nm.class)
}

// damage stops n, flips a bit in (bitflip) or truncates (truncate) one of
// its log files and starts it again. On a cluster the node starts with the
// damage in place (its client ports as before): damage it pins on queues
// must be refused naming each queue and the damaged file, and each such
// replica is rebuilt from its peers by the cluster itself, which the
// harness waits for (rebuildQueues); damage to its metadata, or that it
// cannot pin on queues, must refuse the start naming the file, and then
// the whole node is rebuilt from its peers (rebuild); or the node starts
// with nothing refused and nothing confirmed lost (the checker's verdict
// at the end). A single node has no peers: it starts first on ports no
// client knows, and if it refuses (to start, or a queue) naming the file
// it gets its undamaged copy back.
func (nm *nemesis) damage(ctx context.Context, n *node) error {
	n.kill()
	files, err := n.logFiles()
	if err != nil {
		return err
	}
	// Newest WAL: its tail is what a torn write looks like, so only its
	// first 80 % is damaged (intact records must follow the damage).
	var names []string
	newestWAL := ""
	for f := range files {
		names = append(names, f)
		if b := baseName(f); strings.HasPrefix(b, "wal-") && b > baseName(newestWAL) {
			newestWAL = f
		}
	}
	sort.Strings(names)
	var targets []string
	for _, f := range names {
		if strings.HasPrefix(baseName(f), "seg-") {
			targets = append(targets, f)
		}
	}
	if len(targets) == 0 || nm.r.IntN(3) == 0 {
		for _, f := range names {
			if strings.HasPrefix(baseName(f), "wal-") && (f != newestWAL || nm.class == "bitflip") {
				targets = append(targets, f)
			}
		}
	}
	if len(targets) == 0 {
		nm.note("event %d: no segment or sealed WAL file to %s yet (the newest WAL's tail cannot be told from a torn write); restarted undamaged", nm.res.Events+1, nm.class)
		return n.start(ctx, 60*time.Second)
	}
	target := targets[nm.r.IntN(len(targets))]
	size := files[target]
	limit := size
	if target == newestWAL {
		limit = max(17, size*8/10)
	}
	backup := ""
	if len(nm.cl.nodes) == 1 {
		backup = n.dir + ".undamaged"
		if err := copyDir(n.dir, backup); err != nil {
			return err
		}
		defer os.RemoveAll(backup)
	}
	var what string
	if nm.class == "bitflip" {
		off := 16 + nm.r.Int64N(limit-16)
		bit := uint(nm.r.IntN(8))
		if err := flipBit(target, off, bit); err != nil {
			return err
		}
		what = fmt.Sprintf("bit %d of byte %d of %s (%d B)", bit, off, baseName(target), size)
	} else {
		to := 16 + nm.r.Int64N(limit-16)
		if err := os.Truncate(target, to); err != nil {
			return err
		}
		what = fmt.Sprintf("%s truncated from %d to %d B", baseName(target), size, to)
	}
	ev := nm.res.Events + 1
	if len(nm.cl.nodes) > 1 {
		return nm.damagedMember(ctx, n, ev, target, what)
	}
	// The first start after the damage is on ports no client knows: if
	// the node takes the damage for good data, nothing confirmed meets it
	// before the verdict; if it refuses (to start, or a queue), the
	// undamaged copy goes back exactly as it was.
	logFrom := n.logSize()
	var private [2]string
	if private[0], err = freePort(); err == nil {
		private[1], err = freePort()
	}
	if err != nil {
		return err
	}
	// Never through n.listen: the clients read it (url) whenever they
	// reconnect, and one that found this start would have its publishes
	// confirmed by data that is then thrown away (a "loss" the harness
	// made: session 9, the first runs where a damaged node started).
	n.private = private
	err = n.start(ctx, 60*time.Second)
	n.kill()
	n.private = [2]string{}
	var se *startError
	refused := ""
	switch {
	case err == nil:
		if line := refusal(n.logSince(logFrom)); line != "" {
			refused = "started, one queue refused: " + line
		} else {
			nm.note("event %d: %s: started, nothing refused (the damage was not read at start)", ev, what)
			return n.start(ctx, 60*time.Second)
		}
	case errors.As(err, &se):
		refused = "refused to start: " + lastLines(se.log, 1)
	default:
		return err
	}
	named, queue := mentions(refused, target)
	q := "no queue named"
	if queue != "" {
		q = "names queue " + queue
	}
	nm.note("event %d: %s: %s (names the file: %v; %s)", ev, what, refused, named, q)
	if !named {
		nm.fail("event %d: the refusal does not name the damaged file %s", ev, baseName(target))
	}
	// One node has no peers to rebuild from: the undamaged copy back.
	if err := os.RemoveAll(n.dir); err != nil {
		return err
	}
	if err := os.Rename(backup, n.dir); err != nil {
		return err
	}
	return n.start(ctx, 60*time.Second)
}

// damagedMember starts cluster node n with damage in its log (target,
// done as what) and checks what it makes of it: a refused start (damaged
// metadata, or damage it cannot pin on queues) rebuilds the whole node
// from its peers; queues refused by name are rebuilt by the cluster, and
// the harness waits until each has its replica on n back.
func (nm *nemesis) damagedMember(ctx context.Context, n *node, ev int, target, what string) error {
	logFrom := n.logSize()
	err := n.start(ctx, 60*time.Second)
	var se *startError
	switch {
	case errors.As(err, &se):
		line := lastLines(se.log, 1)
		kind := "damage it cannot pin on queues"
		if strings.Contains(line, "metadata of this node is damaged") {
			kind = "its metadata damaged"
		}
		named, _ := mentions(line, target)
		nm.note("event %d: %s: refused to start (%s): %s (names the file: %v); the whole node is rebuilt", ev, what, kind, line, named)
		if !named {
			nm.fail("event %d: the refusal does not name the damaged file %s", ev, baseName(target))
		}
		nm.res.NodeRebuilds++
		return nm.rebuild(ctx, n, ev)
	case err != nil:
		return err
	}
	refused := refusedQueues(n.logSince(logFrom))
	if len(refused) == 0 {
		nm.note("event %d: %s: started, nothing refused (the damage was not read at start)", ev, what)
		return nil
	}
	var queues []string
	for _, q := range slices.Sorted(maps.Keys(refused)) {
		named, _ := mentions(refused[q], target)
		nm.note("event %d: %s: started; queue %s refused on node %d (names the file: %v): %s", ev, what, q, n.id, named, refused[q])
		if !named {
			nm.fail("event %d: the refusal of queue %s does not name the damaged file %s", ev, q, baseName(target))
		}
		queues = append(queues, q)
	}
	return nm.rebuildQueues(ctx, n, ev, queues)
}

// refusedQueues maps each queue an error log line refuses for damaged
// data (broker: "queue refused ... damaged") to that line.
func refusedQueues(log string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "refused") || !strings.Contains(l, "damaged") {
			continue
		}
		if _, q := mentions(l, ""); q != "" {
			if _, seen := out[q]; !seen {
				out[q] = l
			}
		}
	}
	return out
}

// rebuildQueues waits (60 s) until each of queues has its replica on n
// back: n's copy open again (a follower or the leader, no replica error),
// n among its replicas and the replica count whole. The next fault waits
// for it: a second damaged replica before the first is rebuilt is two of
// three lost.
func (nm *nemesis) rebuildQueues(ctx context.Context, n *node, ev int, queues []string) error {
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	for {
		short := ""
		for _, q := range queues {
			var info struct {
				Replicas []uint64 `json:"replica_nodes"`
				Role     string   `json:"raft_role"`
				Err      string   `json:"replica_error"`
				Voters   []uint64 `json:"raft_voters"`
			}
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			err := n.getJSON(qctx, "/api/queues/"+q, &info)
			cancel()
			// Rebuilt: its copy here open again and a voter once more (the
			// copy comes back as a learner: until it is promoted, one more
			// lost replica is a lost majority), with the replica count whole.
			want := min(3, len(nm.cl.nodes))
			if err != nil || (info.Role != "follower" && info.Role != "leader") || info.Err != "" ||
				len(info.Replicas) < want || !slices.Contains(info.Replicas, uint64(n.id)) ||
				len(info.Voters) < want || !slices.Contains(info.Voters, uint64(n.id)) {
				short = fmt.Sprintf("%s: role %q on node %d, replicas %v, voters %v (%v)", q, info.Role, n.id, info.Replicas, info.Voters, err)
				break
			}
		}
		if short == "" {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			nm.fail("event %d: queue(s) %v refused on node %d, not rebuilt from its peers within 60 s: %s", ev, queues, n.id, short)
			return nil
		}
		nm.sleep(ctx, 100*time.Millisecond)
	}
	nm.res.QueueRebuilds += len(queues)
	nm.note("event %d: queue(s) %v rebuilt on node %d from its peers: open again with its replicas whole %v after the node started", ev, queues, n.id, time.Since(start).Round(10*time.Millisecond))
	return nil
}

// refusal returns the first log line where warrend refuses damaged data
// while it runs (a durable queue refused or not recovered, or a corrupt
// log read).
func refusal(log string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=ERROR") && (strings.Contains(l, "corrupt") || strings.Contains(l, "not recovered") ||
			(strings.Contains(l, "refused") && strings.Contains(l, "damaged"))) {
			return l
		}
	}
	return ""
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// healAll resumes every paused node, starts every stopped one and heals
// every link.
func (nm *nemesis) healAll(ctx context.Context) {
	if nm.cl.net != nil {
		nm.cl.net.Heal()
	}
	for _, n := range nm.cl.nodes {
		n.signal(syscall.SIGCONT)
		if up, unexpected := n.running(); !up {
			if unexpected != nil {
				nm.fail("%v", unexpected)
			}
			if err := n.start(ctx, 60*time.Second); err != nil {
				nm.fail("restarting node %d to drain: %v", n.id, err)
			}
		}
	}
}

// rebuild replaces damaged node n with a new node rebuilt from its peers,
// as an operator would: n is removed from the cluster for good (its
// queue replicas re-placed on the others), its data deleted, and it
// starts again empty as a new node id that joins through a member; the
// cluster gives it replicas again until every queue has its replica
// count back, which rebuild waits for (60 s), so nothing is restored from
// an undamaged copy.
func (nm *nemesis) rebuild(ctx context.Context, n *node, ev int) error {
	var via *node
	for _, m := range nm.cl.nodes {
		if up, _ := m.running(); up && m != n {
			via = m
			break
		}
	}
	if via == nil {
		return fmt.Errorf("jepsen: event %d: no node running to rebuild node %d from", ev, n.id)
	}
	old := n.id
	if err := via.post(ctx, "/api/cluster/leave", map[string]any{"node_id": old}); err != nil && !strings.Contains(err.Error(), "already removed") {
		return fmt.Errorf("jepsen: event %d: removing damaged node %d: %w", ev, old, err)
	}
	if err := os.RemoveAll(n.dir); err != nil {
		return err
	}
	nm.cl.lastID++
	n.id = nm.cl.lastID
	n.args = []string{"--node-id", fmt.Sprint(n.id), "--cluster-listen", n.clusterAddr, "--join", via.clusterAddr}
	start := time.Now()
	if err := n.start(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("jepsen: event %d: node %d rebuilt as node %d: %w", ev, old, n.id, err)
	}
	// Every queue's replica count restored (3 on three nodes): its
	// replicas as they are once every move is done (the admin API shows
	// the replicas before a move until it is), none on the removed node.
	// The next fault waits for it: a second damaged replica before the
	// first is rebuilt is two of three lost.
	deadline := time.Now().Add(60 * time.Second)
	for {
		short := ""
		for _, q := range nm.c.queues {
			var info struct {
				Replicas []uint64 `json:"replica_nodes"`
			}
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			err := via.getJSON(qctx, "/api/queues/"+q, &info)
			cancel()
			if err != nil || len(info.Replicas) < min(3, len(nm.cl.nodes)) || slices.Contains(info.Replicas, uint64(old)) {
				short = fmt.Sprintf("%s on %v (%v)", q, info.Replicas, err)
				break
			}
		}
		if short == "" {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			nm.fail("event %d: node %d rebuilt as node %d, but not every queue has its replicas back within 60 s: %s", ev, old, n.id, short)
			return nil
		}
		nm.sleep(ctx, 100*time.Millisecond)
	}
	nm.note("event %d: node %d removed and rebuilt from its peers as node %d: every queue has its replicas back %v after it started", ev, old, n.id, time.Since(start).Round(10*time.Millisecond))
	return nil
}
