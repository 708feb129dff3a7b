package broker

import (
	"context"

	"github.com/cespare/xxhash/v2"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// This file is what a connection layer (netio) uses of the broker besides
// Submit: the topology requests in a user's name, the routing view, and a
// queue's fixed settings and published counts.

// DeclareExchangeAs declares an exchange as EXCHANGE_DECLARE does, for user.
func (b *Broker) DeclareExchangeAs(d *wire.ExchangeDeclare, user string) error {
	return b.topo.declareExchange(d, user)
}

// DeleteExchangeAs deletes an exchange as EXCHANGE_DELETE does, for who:
// a user who is not an administrator may delete only what it declared.
func (b *Broker) DeleteExchangeAs(d *wire.ExchangeDelete, who Requester) error {
	return b.topo.deleteExchange(d, who)
}

// DeclareQueueAs declares a queue as QUEUE_DECLARE does, for user on
// connection owner (the owner of an exclusive queue).
func (b *Broker) DeclareQueueAs(d *wire.QueueDeclare, owner uint64, user string) (*Queue, error) {
	return b.topo.declareQueue(d, owner, user)
}

// BindAs adds or removes a binding as BIND does, for who: a user who is
// not an administrator may remove only a binding it made.
func (b *Broker) BindAs(d *wire.Bind, who Requester) error {
	return b.topo.bind(d, who)
}

// LookupQueue is the queue named name, or nil.
func (b *Broker) LookupQueue(name string) *Queue { return b.topo.lookupQueue(name) }

// View is the current routing view: read it without a lock, route a
// publish through its Table, resolve the refs it returns with Queue.
func (b *Broker) View() *RouteView { return b.topo.view.Load() }

// BeginControlRun and EndControlRun bracket a run of topology requests
// (declares, binds, queue deletes) from one connection: the routing view
// is rebuilt once, at the end of the run, not once per request. Every
// Begin needs its End.
func (b *Broker) BeginControlRun() { b.topo.batching.Add(1) }

// EndControlRun ends a run begun with BeginControlRun by connection conn
// (the Owner of its CmdDelete commands). It first waits until the
// queues' shards have answered every CmdDelete conn submitted (each
// answer is given once the deletion is proposed: handed to the metadata
// log, or in a cluster to the metadata group). Then, with a metadata
// log, it waits until every change made so far is durable (one entry,
// one fsync for the whole run: send the run's replies only after it;
// a delete's answer, given meanwhile, must be held until then too), in
// a cluster until the queue deletions conn asked for are applied here
// (any other change was waited for by its request), then publishes the
// routing view if the run changed it. An error means the changes may be
// lost, or in a cluster not applied yet (a deletion: "it may still be
// applied"), so the replies must not go out.
func (b *Broker) EndControlRun(conn uint64) error {
	b.waitDeletes(conn)
	err := b.topo.sync(context.Background(), syncFor{conn: conn})
	b.topo.batching.Add(-1)
	b.topo.publishIfDirty()
	return err
}

// delWait counts a connection's CmdDelete commands not yet answered
// (Broker.dels); done is closed when the count drops to 0.
type delWait struct {
	n    int
	done chan struct{}
}

// runDelete is the Sink of a connection's CmdDelete (Submit): it tells
// the broker once the answer is given.
type runDelete struct {
	Sink
	b    *Broker
	conn uint64
}

// Answer gives the answer, then counts it.
func (d *runDelete) Answer(req uint64, r Result) {
	d.Sink.Answer(req, r)
	b := d.b
	b.delMu.Lock()
	if w := b.dels[d.conn]; w != nil {
		if w.n--; w.n == 0 {
			delete(b.dels, d.conn)
			close(w.done)
		}
	}
	b.delMu.Unlock()
}

// trackDelete counts a CmdDelete of connection conn until its answer
// (runDelete). A delete is no hot path: this allocates.
func (b *Broker) trackDelete(conn uint64, k Sink) Sink {
	b.delMu.Lock()
	w := b.dels[conn]
	if w == nil {
		w = &delWait{done: make(chan struct{})}
		b.dels[conn] = w
	}
	w.n++
	b.delMu.Unlock()
	return &runDelete{Sink: k, b: b, conn: conn}
}

// waitDeletes waits until every CmdDelete conn submitted is answered, or
// the shards stopped (what they had not run is never answered).
func (b *Broker) waitDeletes(conn uint64) {
	b.delMu.Lock()
	w := b.dels[conn]
	b.delMu.Unlock()
	if w == nil {
		return
	}
	select {
	case <-w.done:
	case <-b.stopped:
	}
}

// ViewRebuilds counts the routing view's rebuilds (for tests).
func (b *Broker) ViewRebuilds() int64 { return b.topo.rebuilds.Load() }

// Name is the queue's name.
func (q *Queue) Name() string { return q.name }

// ShardIndex is the index of the shard that owns the queue (below
// Broker.Shards): a publish part groups its items by it.
func (q *Queue) ShardIndex() int { return q.shardIdx }

// ExclusiveTo is the id of the connection the queue is exclusive to, 0 if
// it is not exclusive.
func (q *Queue) ExclusiveTo() uint64 { return q.exclusive }

// DeclaredBy is the user who declared the queue ("" for the operator).
func (q *Queue) DeclaredBy() string { return q.declaredBy }

// Args are the queue's parsed arguments.
func (q *Queue) Args() wire.QueueArgs { return q.args }

// ReadyCount and ConsumerCount are the counts its shard published last.
func (q *Queue) ReadyCount() int64 { return q.ready.Load() }

// ConsumerCount: see ReadyCount.
func (q *Queue) ConsumerCount() int64 { return q.consumers.Load() }

// Local says the queue's consumers and gets are never forwarded to
// another node: the broker is not in a cluster. Any goroutine.
func (q *Queue) Local() bool { return !q.shard.clustered() }

// Gone says the queue was deleted. Only its shard may ask (a Sink called
// by it); anyone else reads a race.
func (q *Queue) Gone() bool { return q.gone }

// NewConsumerID gives out a consumer id, unique in this broker.
func (b *Broker) NewConsumerID() queue.ConsumerID {
	return queue.ConsumerID(b.consumerSeq.Add(1))
}

// DedupKey hashes a message id for a queue's dedup window (0: none).
func DedupKey(id []byte) uint64 {
	if len(id) == 0 {
		return 0
	}
	if k := xxhash.Sum64(id); k != 0 {
		return k
	}
	return 1
}

// ApplyMeta applies one encoded metadata command (AppendMetaCommand) as
// the broker's own requests are applied: what a log of metadata commands
// replays through. An error means the bytes are no command; a refusal is
// in the result.
func (b *Broker) ApplyMeta(cmd []byte) (MetaResult, error) {
	c, err := DecodeMetaCommand(cmd)
	if err != nil {
		return MetaResult{}, err
	}
	t := b.topo
	t.mu.Lock()
	r := t.applyLocked(&c)
	t.mu.Unlock()
	t.publishIfDirty()
	return r, nil
}

// MetaSnapshot is the metadata state machine's snapshot now.
func (b *Broker) MetaSnapshot() []byte {
	b.topo.mu.Lock()
	defer b.topo.mu.Unlock()
	return b.topo.meta.Snapshot()
}
