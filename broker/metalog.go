package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// MetaLogConfig says where the metadata group keeps its log.
type MetaLogConfig struct {
	Log       *segment.Log
	Snapshots *replication.SnapStore // the node's snapshot store over Log
	// SnapshotEntries: entries between snapshots of the metadata state
	// (0: 10,000; the log is compacted to each snapshot).
	SnapshotEntries int
	// Fatal hears a failed write of the metadata log: the node must stop
	// and recover from the log (warrend exits non-zero).
	Fatal func(error)
	// A cluster (cluster.go): with several Peers (every voter, this node
	// included) the metadata group has that many voters, NodeID is this
	// node's, Send carries the group's raft messages, and the caller
	// hands the group what peers send (MetaGroup().Step) and ticks it
	// every 100 ms (MetaGroup().Tick). Timeout bounds how long a
	// topology request waits for the cluster to apply it (0:
	// DefaultMetaTimeout).
	NodeID  uint64
	Peers   []uint64
	Send    func(gid uint64, msgs []raftpb.Message)
	Timeout time.Duration
	// TickEvery is the metadata group's raft tick in a cluster (0: 100 ms,
	// design §6.5: a dead leader is replaced in 1-2 s).
	TickEvery time.Duration
	Membership
}

// Membership is how a cluster node's metadata group reaches the other
// nodes for membership (members.go). Addrs are the cluster addresses of
// Peers. Join (a node joining a cluster, no Peers) is called when the log
// holds no metadata state yet: it asks a member to add this node and
// returns the members' addresses. OnMembers hears the members (their
// addresses, removed ids) once recovered and at every change: the
// transport dials them (cluster.Transport.SetPeers). OnRemoved hears that
// this node was removed from the cluster (it stops serving). Forward
// carries a membership request to the metadata leader (cluster.Transport.
// CallNode), and SendSnapshot the group's snapshot to a node behind its
// log (cluster.Transport.SendSnapshot).
type Membership struct {
	Addrs        map[uint64]string
	Join         func(ctx context.Context) (map[uint64]string, error)
	OnMembers    func(members map[uint64]string, removed []uint64)
	OnRemoved    func()
	Forward      func(ctx context.Context, node uint64, op byte, body []byte) ([]byte, error)
	SendSnapshot func(gid uint64, s *replication.SnapshotMessage, done func(ok bool))
}

// OpenMetaLog makes the topology durable (design §4, on one node): it
// recovers the metadata state machine from cfg.Log (the latest snapshot,
// then the log after it), logs a NodeUp that drops what does not outlive a
// restart (non-durable exchanges, non-durable and exclusive queues, the
// bindings touching them), installs the result (queues on their shards,
// the routing view), and from then on logs every topology change. It
// returns once the NodeUp is durable: open the listeners after it.
//
// Call it once, after Start and before any topology request. Without it
// the topology is in memory only, as before.
func (b *Broker) OpenMetaLog(ctx context.Context, cfg MetaLogConfig) error {
	if len(cfg.Peers) > 1 || cfg.Join != nil {
		return b.openClusterMeta(ctx, cfg)
	}
	t := b.topo
	t.restoring.Store(true)
	defer b.topologyRestored()
	// The log holds only changes that were within the limits when made:
	// recovery replays them all, whatever the limits are now.
	rec := NewMetaWithLimits(len(b.shards), noMetaLimits)
	g, err := replication.OpenMeta(replication.MetaConfig{
		Log: cfg.Log, Snapshots: cfg.Snapshots, Machine: &MetaMachine{Meta: rec},
		Lock: &t.mu, Snapshot: func() []byte { return t.meta.Snapshot() },
		SnapshotEntries: cfg.SnapshotEntries, Fatal: cfg.Fatal, Logger: b.log,
	})
	if err != nil {
		return err
	}
	up := MetaCommand{Op: MetaNodeUp, NowMs: b.NowMs()}
	_, dropped := rec.Apply(&up)
	t.mu.Lock()
	err = (&MetaMachine{Meta: t.meta, Sink: t}).Restore(0, rec.Snapshot())
	var seq uint64
	if err == nil {
		t.mlog.Store(g)
		seq = g.Add(AppendMetaCommand(nil, &up))
	}
	t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("broker: installing the recovered topology: %w", err)
	}
	t.publishIfDirty()
	g.Start()
	if err := g.Wait(ctx, seq); err != nil {
		_ = g.Close(context.Background())
		return err
	}
	b.log.Info("topology recovered", "exchanges", rec.NumExchanges(), "queues", rec.NumQueues(), "bindings", rec.NumBindings(),
		"dropped_non_durable", len(dropped))
	return nil
}

// OpenNodeLog opens (creating it) the node's log in dir/log and its
// snapshot store: the one log of the node, for OpenMetaLog and
// Config.Durable alike (one SnapStore per log). The caller closes the
// log, after CloseMetaLog and Stop.
//
// Damage (segment.Options.Quarantine): a durable queue's group whose data
// is damaged is quarantined, and the queue is refused by name when it
// opens (openDurable; in a cluster its copy here is rebuilt from the other
// replicas). Damage to the node's metadata (the metadata group, the
// snapshot store) or damage the log cannot attribute to groups is an
// error naming the file (segment.ErrCorrupt): the node does not start.
func OpenNodeLog(dir string, logger *slog.Logger) (*segment.Log, *replication.SnapStore, error) {
	return openNodeLog(segment.OSFS{}, filepath.Join(dir, "log"), logger)
}

// openNodeLog is OpenNodeLog over fs, in path.
func openNodeLog(fs segment.FS, path string, logger *slog.Logger) (*segment.Log, *replication.SnapStore, error) {
	// Damage that refuses the node is refused before the log writes
	// anything (CheckDamage): the data directory stays as it was found,
	// for an operator or a later build to inspect or repair.
	var damaged []segment.DamagedGroup
	var refused error
	l, err := segment.Open(fs, path, segment.Options{Logger: logger, Quarantine: true,
		CheckDamage: func(d []segment.DamagedGroup) error {
			damaged, refused = d, metadataDamage(d)
			return refused
		}})
	if refused != nil && errors.Is(err, refused) {
		var groups []uint64
		wal := "" // the first damaged WAL file
		for _, d := range damaged {
			if d.Group >= QueueGroupBase {
				groups = append(groups, d.Group)
			}
			if strings.HasPrefix(d.File, "wal-") && (wal == "" || d.File < wal) {
				wal = d.File
			}
		}
		if len(groups) > 0 {
			return nil, nil, fmt.Errorf("opening the log in %s: %w%s", path, err, damagedQueueNames(fs, path, wal, groups))
		}
		return nil, nil, fmt.Errorf("opening the log in %s: %w", path, err)
	}
	if err != nil {
		if errors.Is(err, segment.ErrUnattributable) {
			return nil, nil, fmt.Errorf("opening the log in %s: %w%s", path, err, damagedQueueNames(fs, path, "", nil))
		}
		return nil, nil, fmt.Errorf("opening the log in %s: %w", path, err)
	}
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		_ = l.Close()
		return nil, nil, fmt.Errorf("reading the snapshot store of the log in %s: %w", path, err)
	}
	return l, store, nil
}

// CloseMetaLog writes the topology changes made so far and stops the
// metadata group (before closing its segment.Log). Later topology
// requests are refused.
func (b *Broker) CloseMetaLog(ctx context.Context) error {
	if g := b.topo.mlog.Load(); g != nil {
		if cl := b.topo.cl.Load(); cl != nil {
			cl.stopTick()
		}
		return g.Close(ctx)
	}
	return nil
}

// MetaSync waits until every topology change made so far is durable (at
// once without a metadata log). In a cluster it returns at once: every
// request waited for its own change, and a queue deletion is waited for
// by its own request only (EndControlRun, DeleteQueue).
func (b *Broker) MetaSync(ctx context.Context) error { return b.topo.sync(ctx, syncFor{}) }

// sync waits for the metadata log to hold every change applied so far;
// in a cluster, for the queue deletions what names to be applied here
// (clusterSync).
func (t *topology) sync(ctx context.Context, what syncFor) error {
	g := t.mlog.Load()
	if g == nil {
		return nil
	}
	if cl := t.cl.Load(); cl != nil {
		return t.clusterSync(ctx, cl, what)
	}
	if err := g.Wait(ctx, g.Added()); err != nil {
		if errors.Is(err, ctx.Err()) {
			return err
		}
		return &wire.Error{Code: wire.InternalError, Reason: "the topology change may not be on disk: " + err.Error()}
	}
	return nil
}

// logLocked logs a command that changed the state (mu held): its effects
// say so (a refusal, or a declare of what exists, changes nothing).
func (t *topology) logLocked(c *MetaCommand, effs []MetaEffect) {
	g := t.mlog.Load()
	if g == nil || t.cl.Load() != nil {
		return
	}
	for i := range effs {
		if effs[i].Kind != EffDurableAccepted {
			t.mbuf = AppendMetaCommand(t.mbuf[:0], c)
			g.Add(t.mbuf)
			if t.batching.Load() == 0 {
				// Nobody will wait for it in a run's end (a shard deleted
				// a queue, an exclusive owner went): write it now.
				g.Kick()
			}
			return
		}
	}
}

// metadataDamage is the error for damaged groups that are not durable
// queues' (nil when every damaged group is a queue's): the metadata
// group, the snapshot store of every group, or any other group below
// QueueGroupBase. The node cannot start without them.
func metadataDamage(damaged []segment.DamagedGroup) error {
	var queues int
	var whats []string
	var first *segment.DamagedGroup
	for i, d := range damaged {
		if d.Group >= QueueGroupBase {
			queues++
			continue
		}
		if first == nil {
			first = &damaged[i]
		}
		switch d.Group {
		case replication.MetaGroupID:
			whats = append(whats, "the metadata group (exchanges, queues, bindings, users; raft group 2)")
		case replication.SnapStoreGroup:
			whats = append(whats, "the snapshot store of every raft group (raft group 1)")
		default:
			whats = append(whats, fmt.Sprintf("raft group %d", d.Group))
		}
	}
	if first == nil {
		return nil
	}
	where := ""
	if first.File != "" {
		where = fmt.Sprintf(", in %s at offset %d", first.File, first.Offset)
	}
	also := ""
	if queues > 0 {
		also = fmt.Sprintf("; the damage also reaches %d durable queue(s)", queues)
	}
	return fmt.Errorf("%w: the metadata of this node is damaged: %s%s: %s%s; refusing to start: rebuild this node from its peers (remove it from the cluster, delete its data, join it again) or restore its data",
		segment.ErrCorrupt, strings.Join(whats, " and "), where, first.Why, also)
}

// damagedQueueMsg is why a durable queue whose group the log quarantined
// is refused here (log, clients, admin API).
func damagedQueueMsg(q *Queue, d segment.DamagedGroup) string {
	where := d.File
	if where != "" {
		where = fmt.Sprintf(" (%s at offset %d)", d.File, d.Offset)
	}
	return fmt.Sprintf("%s: its data on this node is damaged%s: %s", QueueText(q.name), where, d.Why)
}
