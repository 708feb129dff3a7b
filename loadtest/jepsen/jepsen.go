// Package jepsen is Warren's fault harness (design/replication.md §6.9):
// it starts warrend processes on loopback, runs producers (unique
// producer and sequence ids, persistent messages, confirms) and consumers
// (acks, random requeues, cancels and reconnects) against them while a
// nemesis applies one class of fault, then heals, drains every queue and
// checks the history: lost (confirmed, never consumed) and invented
// (consumed, never published, or not as published) must be 0; duplicates
// are counted. cmd/warren-jepsen is its command line.
package jepsen

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/loadtest"
	"github.com/warren-mq/warren/loadtest/faultnet"
)

// Classes are the fault classes, in the order a full run takes them.
// The partition classes need a cluster (Nodes ≥ 3).
var Classes = []string{"kill", "pause", "powerloss", "bitflip", "truncate", "restart", "kill-leader", "membership", "partition", "partition-oneway", "delay", "drop"}

var clusterOnly = map[string]bool{"kill-leader": true, "membership": true, "partition": true, "partition-oneway": true, "delay": true, "drop": true}

// Config is one run.
type Config struct {
	Warrend   string        // the warrend binary
	Dir       string        // working directory (data, logs); a temporary one if empty
	Nodes     int           // warrend processes: 1, or 3 or 5 as a cluster (--peers)
	Classes   []string      // fault classes to run (default: every one the node count allows)
	Time      time.Duration // each class's fault phase
	Producers int
	Consumers int
	Queues    int
	Rate      int // messages per second per producer
	Size      int // message bytes
	// FileSize is the nodes' WAL and segment file size (test-only
	// WARREN_TEST_WAL_SIZE and _SEGMENT_SIZE): small, so that a short run
	// rotates WAL files and writes segment files for the damage classes.
	// 0: 1 MiB; negative: warrend's default (64 MiB).
	FileSize int64
	Seed     uint64
	Out      io.Writer
}

// Result is one class's outcome.
type Result struct {
	Class    string
	Skipped  string // why it did not run
	Events   int    // faults applied
	Counts   loadtest.Counts
	Recovery []time.Duration // per event: heal → next confirm on every producer and next delivery on every consumer
	Notes    []string        // what the nemesis saw (refusals, unexpected exits)
	// Damage classes on a cluster: queue replicas refused by name and
	// rebuilt by the cluster itself; nodes refused whole and rebuilt.
	QueueRebuilds, NodeRebuilds int
	Failed                      []string // harness failures besides lost/invented
	Reconn                      int64
	Requeues                    int64
	Cancels                     int64
}

// Run runs every class and writes a table and the final line. Its error
// is non-nil when anything was lost or invented (or a class failed).
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	var lostOrInvented bool // the verdict: a temporary directory is then kept
	if cfg.Nodes <= 0 {
		cfg.Nodes = 1
	}
	if cfg.Time <= 0 {
		cfg.Time = 10 * time.Second
	}
	cfg.Producers, cfg.Consumers, cfg.Queues = max(cfg.Producers, 1), max(cfg.Consumers, 1), max(cfg.Queues, 1)
	if cfg.Rate <= 0 {
		cfg.Rate = 500
	}
	if cfg.Size <= 0 {
		cfg.Size = 256
	}
	if cfg.FileSize == 0 {
		cfg.FileSize = 1 << 20
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if len(cfg.Classes) == 0 {
		for _, c := range Classes {
			if cfg.Nodes > 1 || !clusterOnly[c] {
				cfg.Classes = append(cfg.Classes, c)
			}
		}
	}
	for _, c := range cfg.Classes {
		if !slices.Contains(Classes, c) {
			return nil, fmt.Errorf("jepsen: unknown fault class %q (know %s)", c, strings.Join(Classes, ", "))
		}
	}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "warren-jepsen-")
		if err != nil {
			return nil, err
		}
		// A run that lost or invented messages keeps its data and the
		// nodes' logs for the post-mortem (said at the end).
		defer func() {
			if lostOrInvented {
				fmt.Fprintf(cfg.Out, "warren-jepsen: kept %s (the nodes' data and logs) for a look at what was lost or invented\n", d)
			} else {
				os.RemoveAll(d)
			}
		}()
		cfg.Dir = d
	}
	fmt.Fprintf(cfg.Out, "warren-jepsen: %d node(s), classes %s, %v each, %d producers × %d msg/s, %d consumers, %d queues, %d B, log files %d B, seed %d, dir %s\n",
		cfg.Nodes, strings.Join(cfg.Classes, ","), cfg.Time, cfg.Producers, cfg.Rate, cfg.Consumers, cfg.Queues, cfg.Size, cfg.FileSize, cfg.Seed, cfg.Dir)
	var results []Result
	for i, class := range cfg.Classes {
		res := runClass(ctx, &cfg, class, cfg.Seed+uint64(i)*7919)
		results = append(results, res)
		printResult(cfg.Out, &res)
	}
	var lost, dup, inv int64
	var failed []string
	for _, r := range results {
		lost += r.Counts.Lost
		dup += r.Counts.Duplicated
		inv += r.Counts.Invented
		for _, f := range r.Failed {
			failed = append(failed, r.Class+": "+f)
		}
	}
	fmt.Fprintln(cfg.Out)
	printTable(cfg.Out, results)
	fmt.Fprintf(cfg.Out, "lost=%d duplicated=%d invented=%d\n", lost, dup, inv)
	lostOrInvented = lost != 0 || inv != 0
	switch {
	case lost != 0 || inv != 0:
		return results, fmt.Errorf("jepsen: lost=%d invented=%d", lost, inv)
	case len(failed) > 0:
		return results, fmt.Errorf("jepsen: %s", strings.Join(failed, "; "))
	}
	return results, nil
}

// cluster is the run's nodes (and their proxies).
type cluster struct {
	nodes  []*node
	net    *faultnet.Net
	lastID int // the highest node id given (nodes rebuilt get new ones: ids are never reused)
}

func (cl *cluster) urls() []string {
	var out []string
	for _, n := range cl.nodes {
		out = append(out, n.url())
	}
	return out
}

// leader is the client URL of the node leading queue, as the first node
// (in a random order) whose admin API answers and names a leader says.
func (cl *cluster) leader(ctx context.Context, queue string) (string, error) {
	byID := map[uint64]*node{}
	for _, n := range cl.nodes {
		byID[uint64(n.id)] = n
	}
	err := fmt.Errorf("jepsen: no node names the leader of %s", queue)
	for _, i := range rand.Perm(len(cl.nodes)) {
		n := cl.nodes[i]
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		var q struct {
			Leader uint64 `json:"leader"`
		}
		e := n.getJSON(qctx, "/api/queues/"+url.PathEscape(queue), &q)
		cancel()
		if e != nil {
			err = e
			continue
		}
		if l, ok := byID[q.Leader]; ok {
			return l.url(), nil
		}
	}
	return "", err
}

func (cl *cluster) stop() {
	for _, n := range cl.nodes {
		n.signal(syscall.SIGCONT)
		n.kill()
	}
	if cl.net != nil {
		cl.net.Close()
	}
}

// newCluster prepares cfg.Nodes nodes under dir: their ports, and with
// several nodes a proxy per ordered pair, each node reaching its peers
// through its own proxies.
func newCluster(cfg *Config, dir string, env []string) (*cluster, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	cl := &cluster{}
	clusterAddr := map[int]string{}
	for i := 1; i <= cfg.Nodes; i++ {
		l, err := freePort()
		if err != nil {
			return nil, err
		}
		h, err := freePort()
		if err != nil {
			return nil, err
		}
		n := &node{id: i, bin: cfg.Warrend, dir: filepath.Join(dir, "node"+strconv.Itoa(i)), listen: l, http: h,
			logPath: filepath.Join(dir, "node"+strconv.Itoa(i)+".log"), env: env}
		cl.nodes = append(cl.nodes, n)
		if cfg.Nodes > 1 {
			if clusterAddr[i], err = freePort(); err != nil {
				return nil, err
			}
		}
	}
	cl.lastID = cfg.Nodes
	if cfg.Nodes > 1 {
		nt, err := faultnet.NewNet(clusterAddr)
		if err != nil {
			return nil, err
		}
		cl.net = nt
		for _, n := range cl.nodes {
			var peers []string
			for j := 1; j <= cfg.Nodes; j++ {
				a := clusterAddr[j]
				if j != n.id {
					a = nt.Link(n.id, j).Addr()
				}
				peers = append(peers, fmt.Sprintf("%d=%s", j, a))
			}
			n.args = []string{"--node-id", strconv.Itoa(n.id), "--cluster-listen", clusterAddr[n.id], "--peers", strings.Join(peers, ",")}
			n.clusterAddr = clusterAddr[n.id]
			n.env = append(n.env, "WARREN_CLUSTER_SECRET=warren-jepsen-cluster-secret-0123456789")
		}
	}
	return cl, nil
}

func runClass(ctx context.Context, cfg *Config, class string, seed uint64) (res Result) {
	res.Class = class
	if clusterOnly[class] && cfg.Nodes < 3 {
		res.Skipped = "needs a cluster (--nodes 3)"
		return res
	}
	dir := filepath.Join(cfg.Dir, class)
	var env []string
	if cfg.FileSize >= 0 {
		fsz := cfg.FileSize
		if fsz == 0 {
			fsz = 1 << 20
		}
		env = append(env, fmt.Sprintf("WARREN_TEST_WAL_SIZE=%d", fsz), fmt.Sprintf("WARREN_TEST_SEGMENT_SIZE=%d", fsz))
	}
	if class == "powerloss" {
		env = append(env, "WARREN_TEST_POWERLOSS=1")
	}
	cl, err := newCluster(cfg, dir, env)
	if err != nil {
		res.Failed = append(res.Failed, err.Error())
		return res
	}
	defer cl.stop()
	// The nodes start together: a cluster's node is ready only once a
	// quorum of its peers runs.
	errs := make([]error, len(cl.nodes))
	var wg sync.WaitGroup
	for i, n := range cl.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.start(ctx, 60*time.Second)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			res.Skipped = "warrend did not start: " + err.Error()
			if cfg.Nodes == 1 {
				res.Failed = append(res.Failed, res.Skipped)
			}
			return res
		}
	}
	if class == "powerloss" {
		for _, n := range cl.nodes {
			if !strings.Contains(n.logTail(1<<16), "WARREN_TEST_POWERLOSS=1") {
				res.Failed = append(res.Failed, fmt.Sprintf("node %d does not say it runs in the power-loss mode", n.id))
			}
		}
	}
	hist := loadtest.NewHistory(cfg.Producers, cfg.Size)
	c := &clients{cfg: cfg, hist: hist, urls: cl.urls,
		lastConfirm: make([]atomic.Int64, cfg.Producers), lastDeliver: make([]atomic.Int64, cfg.Consumers+cfg.Queues)}
	for i := 0; i < cfg.Queues; i++ {
		c.queues = append(c.queues, fmt.Sprintf("jepsen-%d", i))
	}
	if err := declare(ctx, cl.nodes[0].url(), c.queues); err != nil {
		res.Failed = append(res.Failed, "declaring the queues: "+err.Error())
		return res
	}
	prodCtx, stopProd := context.WithCancel(ctx)
	defer stopProd()
	consCtx, stopCons := context.WithCancel(ctx)
	defer stopCons()
	var chaos atomic.Bool
	chaos.Store(true)
	for i := 0; i < cfg.Producers; i++ {
		c.prodWG.Add(1)
		go c.produce(prodCtx, i, seed, 5*time.Second)
	}
	// The damage classes leave every queue but the first without
	// consumers until the drain, so the damaged files hold a backlog.
	damage := class == "bitflip" || class == "truncate"
	for i := 0; i < cfg.Consumers; i++ {
		q := c.queues[i%len(c.queues)]
		if damage {
			q = c.queues[0]
		}
		c.consWG.Add(1)
		go c.consume(consCtx, i, q, seed, &chaos)
	}
	nem := &nemesis{cfg: cfg, cl: cl, c: c, r: rand.New(rand.NewPCG(seed, 99)), res: &res, class: class}
	nem.run(ctx, cfg.Time)
	// Heal: every node running and resumed, every link healed.
	nem.healAll(ctx)
	stopProd()
	c.prodWG.Wait()
	// Drain without chaos until every confirmed message came, or nothing
	// arrives for a while.
	chaos.Store(false)
	for i, q := range c.queues {
		c.consWG.Add(1)
		go c.consume(consCtx, cfg.Consumers+i, q, seed, &chaos)
	}
	drainStart := time.Now()
	lastN, lastMove := hist.Counts().Deliveries, time.Now()
	for ctx.Err() == nil && time.Since(drainStart) < 2*time.Minute {
		time.Sleep(50 * time.Millisecond)
		if d := hist.Counts().Deliveries; d != lastN {
			lastN, lastMove = d, time.Now()
			continue
		}
		idle := time.Since(lastMove)
		if idle >= 5*time.Second || (idle >= 500*time.Millisecond && hist.Lost() == 0) {
			break
		}
	}
	stopCons()
	c.consWG.Wait()
	for _, n := range cl.nodes {
		if _, unexpected := n.running(); unexpected != nil {
			res.Notes = append(res.Notes, unexpected.Error())
		}
	}
	res.Counts = hist.Counts()
	res.Reconn, res.Requeues, res.Cancels = c.reconnects.Load(), c.requeues.Load(), c.cancels.Load()
	return res
}

func declare(ctx context.Context, url string, queues []string) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := client.Dial(dctx, url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel(dctx)
	if err != nil {
		return err
	}
	for _, q := range queues {
		if _, err := ch.DeclareQueue(dctx, q, client.QueueOptions{Durable: true}); err != nil {
			return err
		}
	}
	return nil
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p*float64(len(s)))) - 1 // nearest rank
	return s[max(0, min(len(s)-1, i))]
}

func printResult(w io.Writer, r *Result) {
	if r.Skipped != "" {
		fmt.Fprintf(w, "[%s] skipped: %s\n", r.Class, r.Skipped)
		return
	}
	c := r.Counts
	fmt.Fprintf(w, "[%s] events %d; published %d confirmed %d nacked %d unknown %d consumed %d (deliveries %d); lost %d duplicated %d invented %d; reconnects %d requeues %d cancels %d\n",
		r.Class, r.Events, c.Published, c.Confirmed, c.Nacked, c.Unknown, c.Consumed, c.Deliveries, c.Lost, c.Duplicated, c.Invented, r.Reconn, r.Requeues, r.Cancels)
	for _, l := range c.LostRanges {
		if len(l) > 200 {
			l = l[:200] + "…"
		}
		fmt.Fprintf(w, "[%s]   lost %s\n", r.Class, l)
	}
	if r.QueueRebuilds+r.NodeRebuilds > 0 {
		fmt.Fprintf(w, "[%s]   damage rebuilt from the peers: %d queue replica(s) refused by name and rebuilt by the cluster, %d node(s) refused whole and rebuilt\n",
			r.Class, r.QueueRebuilds, r.NodeRebuilds)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "[%s]   %s\n", r.Class, n)
	}
	for _, f := range r.Failed {
		fmt.Fprintf(w, "[%s]   FAILED: %s\n", r.Class, f)
	}
}

func printTable(w io.Writer, rs []Result) {
	fmt.Fprintln(w, "| class | events | published | confirmed | consumed | lost | duplicated | invented | recovery p50 | recovery max |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		if r.Skipped != "" {
			fmt.Fprintf(w, "| %s | skipped: %s | | | | | | | | |\n", r.Class, r.Skipped)
			continue
		}
		c := r.Counts
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n", r.Class, r.Events, c.Published, c.Confirmed,
			c.Consumed, c.Lost, c.Duplicated, c.Invented, fmtDur(percentile(r.Recovery, 0.5)), fmtDur(percentile(r.Recovery, 1)))
	}
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}
