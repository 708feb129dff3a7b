package broker

import (
	"context"
	"github.com/warren-mq/warren/internal/ratelog"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

// Config is what the broker core needs to know at start.
type Config struct {
	Shards         int   // queue shards (goroutines); at least 1
	QueueSoftLimit int64 // ready messages above which a queue holds back its publishers' confirms (0 or less: never)
	// Limits bound the queues, exchanges and bindings the broker holds
	// (zero fields: DefaultMetaLimits).
	Limits MetaLimits
	Logger *slog.Logger // discard if nil
	// Clock is the broker's one clock source (ms since the epoch), which
	// stamps every command a shard applies; nil: the wall clock.
	Clock func() int64
	// DeadLetterDropped, if set, is told each dead letter that went
	// nowhere, by reason (the broker's metrics count them).
	DeadLetterDropped func(DLDrop)
	// PublishBlocked, if set, reports whether this node holds its own
	// publishers back (the memory or the disk alarm): a publish another
	// node forwards to a queue led here is then refused as busy, and its
	// origin holds it and sends it again (forward.go), rather than this
	// node taking what its own clients may not send.
	PublishBlocked func() bool
	// OnApply, if set, is called on a shard's goroutine with every command
	// the shard applies, just before it applies it, with the shard's index
	// and the time the command is stamped with: a recorder of commands
	// sees the CmdTick commands the shard's timer makes as well as what
	// was submitted. It must not keep c (copy what it needs) nor call into
	// the broker.
	OnApply func(shard int, nowMs int64, c *Command)
	// ManualTicks: the shards arm no timer; whoever drives the broker ticks
	// it, with FireTimers (what a shard's timer does when it fires) or by
	// submitting the CmdTick commands a recording holds. For replays, and
	// tests that drive time themselves.
	ManualTicks bool
	// Durable, when set, makes durable queues raft groups over its log
	// (durable.go); nil keeps every queue in memory.
	Durable *DurableConfig
	// NoInlineShards keeps every shard's work on the shard's goroutine:
	// SubmitInline is then Submit (for comparisons; shard.submitInline).
	NoInlineShards bool
	// Incarnation, when set, is this life's start (OpenIncarnation: above
	// every earlier life's on the same data directory, whatever the clock
	// did), kept up to date while the broker runs; nil: the clock's now
	// (time.Now) at New.
	Incarnation *Incarnation
}

// Broker is the broker core at run time: the topology (exchanges, queues,
// bindings) and the shards that own the queues' machines and bodies. It
// takes commands as values (Submit) and hands effects as values to the
// Sink each command names; it never calls into a connection.
type Broker struct {
	cfg    Config
	log    *slog.Logger
	topo   *topology
	shards []*shard

	seqBase uint64 // the shards' proposal seqs count from here (New)
	// features: what this build tells the other nodes it can do, in its
	// hello (helloFeatures; forward_serve.go).
	features uint64

	// storedBytes is what the stored messages cost (their arenas, counted
	// by reference: see Arena), compared with the memory watermark.
	pool        *replication.Pool // snapshot writes and compactions of durable queues (Config.Durable)
	storedBytes atomic.Int64
	consumerSeq atomic.Uint64
	park        raftPark                    // raft messages for queue groups not open yet (raftpark.go)
	leaving     atomic.Bool                 // TransferLeaderships ran: take no queue leadership back (replicated.go)
	origins     fwdOrigins                  // the incarnations of the nodes whose consumers this node serves (forward_consume.go)
	dlDropLog   [NumDLDrops]ratelog.Limiter // "dead letter dropped" lines, per reason
	// Forwarded publishes (forward.go): parts this node sent again,
	// messages of forwarded parts it did not enqueue again (applied
	// before), and parts it sent that a leader under its alarm refused.
	fwdResent, fwdDuplicates, fwdBusy atomic.Uint64
	fwdNackLog                        ratelog.Limiter          // "forwarded publishes nacked" lines
	removedNodes                      atomic.Pointer[[]uint64] // removed from the cluster (nodesRemoved)
	dlInflight                        atomic.Int64             // held dead letters sent and not yet settled (deadletter.go)
	writeFailed                       atomic.Bool              // a durable queue's log write failed (logFailed)
	shardsStopped                     atomic.Int32             // shards whose run has returned (Stop)
	sweepOnce                         sync.Once                // the first WaitRecovered removes deleted queues' groups
	sweepErr                          error
	// dels: per connection, its CmdDelete commands its queues' shards
	// have not answered yet (runDelete), which its control run's end
	// waits for (EndControlRun); stopped is closed once every shard's
	// run has returned (Stop), so nothing waits for an answer then.
	delMu   sync.Mutex
	dels    map[uint64]*delWait
	stopped chan struct{}
	// incStop, incDone: Start's keepIncarnation (Config.Incarnation).
	incStop, incDone chan struct{}
}

// poolSize is how many snapshot writes and compactions of durable queues
// run at once. Each blocks its goroutine for a group commit, and those
// running together share one, so a small pool is the limit when many
// queues snapshot: with 4, 100 busy queues' snapshots queued behind one
// another for 0.8 s on average, the log they should have freed was moved into
// segment files meanwhile, and the node wrote every body twice
// (BENCHMARKS.md, durable queues: the second write).
const poolSize = 32

// New makes a broker; Start runs its shards.
func New(cfg Config) *Broker {
	if cfg.Shards < 1 {
		cfg.Shards = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	b := &Broker{cfg: cfg, log: cfg.Logger, dels: map[uint64]*delWait{}, stopped: make(chan struct{})}
	// Above every proposal seq an earlier run of this node used
	// (replication.WorkerConfig.SeqBase): its start time, 2^20 seqs a ms
	// (incarnation.go).
	if cfg.Incarnation != nil {
		b.seqBase = uint64(cfg.Incarnation.StartMs()) << 20
	} else {
		b.seqBase = uint64(time.Now().UnixMilli()) << 20
	}
	b.features = helloFeatures
	if cfg.Durable != nil {
		b.pool = replication.NewPool(poolSize)
	}
	b.fwdNackLog.Every = 10 * time.Second
	for i := range b.dlDropLog {
		b.dlDropLog[i].Every = 10 * time.Second
	}
	for i := 0; i < cfg.Shards; i++ {
		b.shards = append(b.shards, newShard(b, i))
	}
	b.topo = newTopology(b.shards, cfg.Limits)
	b.topo.log = b.log
	b.topo.now = b.NowMs
	for _, sh := range b.shards {
		sh.setInline() // (no goroutine runs them yet)
	}
	return b
}

// Start runs the shard goroutines.
func (b *Broker) Start() {
	for _, sh := range b.shards {
		go sh.run()
	}
	if b.cfg.Incarnation != nil {
		b.incStop, b.incDone = make(chan struct{}), make(chan struct{})
		go keepIncarnation(b.cfg.Incarnation, b.log, b.incStop, b.incDone)
	}
}

// Stop stops the shards once they have worked through what was submitted.
func (b *Broker) Stop(ctx context.Context) error {
	for _, sh := range b.shards {
		close(sh.stop)
	}
	for _, sh := range b.shards {
		select {
		case <-sh.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	close(b.stopped)
	if b.incStop != nil {
		// Nothing is proposed or forwarded any more: the incarnation's
		// bound comes down to what this life ran.
		close(b.incStop)
		select {
		case <-b.incDone:
		case <-ctx.Done(): // a hung disk: the last renewal's bound holds
		}
	}
	// The shards quiesced their durable queues' writes; the workers'
	// appenders and the pool stop (the log is the caller's to close).
	for _, sh := range b.shards {
		if sh.rw != nil {
			sh.rw.Close()
		}
	}
	if b.pool != nil {
		b.pool.Close()
	}
	return nil
}

// NowMs reads the broker's clock source (ms).
func (b *Broker) NowMs() int64 {
	if b.cfg.Clock != nil {
		return b.cfg.Clock()
	}
	return time.Now().UnixMilli()
}

// IncarnationMs is this life's incarnation: its start (ms), above every
// earlier life's on the same data directory (Config.Incarnation).
func (b *Broker) IncarnationMs() int64 { return int64(b.seqBase >> 20) }

// Shards is the number of shards; a queue's ShardIndex is below it.
func (b *Broker) Shards() int { return len(b.shards) }

// StoredBytes is what the stored messages cost now.
func (b *Broker) StoredBytes() int64 { return b.storedBytes.Load() }

// AddStoredBytes counts an arena a loop has just routed (before any shard
// has it), so the loop's next check of the watermark sees it.
func (b *Broker) AddStoredBytes(n int64) { b.storedBytes.Add(n) }

// Submit hands a command to the shard that owns its queue: the Queue's,
// or for a publish part or a run of settlements that of its first item
// (a publish part is one shard's; settlements are split by shard here).
// A Down or a CmdReleaseEnded goes to every shard. Safe from any
// goroutine; it copies the command and allocates nothing (but for
// splitting settlements).
func (b *Broker) Submit(c Command) {
	switch {
	case c.Kind == CmdDown || c.Kind == CmdReleaseEnded:
		for _, sh := range b.shards {
			sh.submit(c)
		}
	case c.Kind == CmdSettle:
		b.settleAcross(c.Settles, false)
	case c.Queue != nil:
		if c.Kind == CmdDelete && c.Owner != 0 {
			c.Sink = b.trackDelete(c.Owner, c.Sink)
		}
		c.Queue.shard.submit(c)
	case c.Kind == CmdPublish && len(c.Items) > 0:
		c.Items[0].Q.shard.submit(c)
	default:
		panic("broker: BUG: a command with no queue")
	}
}

// SubmitInline is Submit for a publish or a settlement from a network
// loop: a shard that is idle and holds only in-memory queues runs it on
// the caller's goroutine before SubmitInline returns (its effects reach
// their sinks then), which saves waking the shard and, for a confirm to
// a connection on the same loop, waking the loop back. The caller must
// hold no lock a sink or the topology takes. Other commands go as
// Submit.
func (b *Broker) SubmitInline(c Command) {
	switch {
	case c.Kind == CmdSettle:
		b.settleAcross(c.Settles, true)
	case c.Kind == CmdPublish && c.Queue == nil && len(c.Items) > 0:
		c.Items[0].Q.shard.submitInline(c)
	default:
		b.Submit(c)
	}
}

// settleAcross groups settlements by shard and submits them (inline: with
// submitInline), each shard its own copy (the caller keeps items).
// Settlements of one shard, the common case, take one pass and one copy.
func (b *Broker) settleAcross(items []SettleItem, inline bool) {
	if len(items) == 0 {
		return
	}
	first := items[0].Q.shard
	one := len(b.shards) == 1
	if !one {
		i := 1
		for i < len(items) && items[i].Q.shard == first {
			i++
		}
		one = i == len(items)
	}
	submit := (*shard).submit
	if inline {
		submit = (*shard).submitInline
	}
	if one {
		submit(first, Command{Kind: CmdSettle, Settles: append([]SettleItem(nil), items...)})
		return
	}
	for _, sh := range b.shards {
		n := 0 // counted first, so the part is allocated once, not regrown
		for i := range items {
			if items[i].Q.shard == sh {
				n++
			}
		}
		if n == 0 {
			continue
		}
		part := make([]SettleItem, 0, n)
		for i := range items {
			if items[i].Q.shard == sh {
				part = append(part, items[i])
			}
		}
		submit(sh, Command{Kind: CmdSettle, Settles: part})
	}
}

// Ask submits a request command and waits for its answer.
func (b *Broker) Ask(ctx context.Context, c Command) (Result, error) {
	if c.Queue == nil {
		return Result{}, &wire.Error{Code: wire.InternalError, Reason: "broker: a request with no queue"}
	}
	return ask(ctx, c.Queue.shard, c)
}

// FireTimers makes every shard do what its timer does when it fires: it
// ticks (a CmdTick each) the queues whose timers are due by the broker's
// clock. For a broker with ManualTicks; harmless on any other.
func (b *Broker) FireTimers() {
	for _, sh := range b.shards {
		sh.submit(Command{Kind: cmdFire})
	}
}

// Barrier waits until every shard has worked through what was submitted
// before it (and handed the effects to their sinks).
func (b *Broker) Barrier(ctx context.Context) error {
	for _, sh := range b.shards {
		if _, err := ask(ctx, sh, Command{Kind: CmdBarrier}); err != nil {
			return err
		}
	}
	return nil
}
