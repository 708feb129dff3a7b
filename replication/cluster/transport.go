// Package cluster carries raft messages between Warren nodes over TCP
// (design/replication.md §6.1): a replication.Transport whose Send
// queues each group's messages for their peer, two writer goroutines per
// peer, each sending everything queued for it since its last write as
// frames on a connection it dials (§6.1: the control connection carries
// raft messages; the data connection forwarded work and snapshots to
// install, so megabytes of bodies never sit in front of a heartbeat), and
// one reader goroutine per inbound connection that hands each message to
// Config.Deliver, each snapshot to install (SendSnapshot, snapshot.go) to
// DeliverSnapshot and each forward to DeliverForward.
//
// Nodes prove they hold the shared cluster secret by HMAC challenge and
// response in both directions; the secret never crosses the wire. A
// message whose From is not the authenticated peer is refused, and so is a
// frame over the size limit, of an unknown kind, or of another protocol
// version. Each peer's queue is bounded (Config.MaxQueueBytes): when it is
// full, Send drops the message (raft resends what matters) and counts it,
// so a dead or slow peer blocks no one. A lost connection is dialled
// again with backoff (50 ms doubling to 2 s, jittered).
//
// Files: transport.go the Transport (Config, New, Close, SetPeers, Send,
// Flush, counters), outbound.go a peer and its lanes' writers,
// inbound.go the accept loop and each connection's reader, handshake.go
// the handshake's two sides, frame.go the frames, snapshot.go snapshots
// sent and spooled, forward.go forwarded work, call.go calls, peers.go
// --peers.
package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// Config configures a Transport.
type Config struct {
	NodeID uint64
	// Listen is the address to listen on; "" listens on Peers[NodeID].
	// Listener, if set, is used instead (tests).
	Listen   string
	Listener net.Listener
	// Peers: every node of the cluster by id (this node's entry, if
	// present, is its advertised address and is not dialled).
	Peers map[uint64]string
	// Secret is the shared cluster secret (at least 16 bytes); required
	// when Peers names another node.
	Secret []byte
	// Deliver takes each message a peer sent for group gid. It is called
	// on the connection's reader goroutine and may block (that connection
	// then stops reading, and TCP pushes back on the sender).
	Deliver func(gid uint64, m raftpb.Message)
	// DeliverSnapshot takes each snapshot a peer sent (SendSnapshot) on
	// the same goroutine; nil drops them.
	DeliverSnapshot func(gid uint64, s *Snapshot)
	// DeliverForward takes each forwarded payload a peer sent
	// (SendForward), on the same goroutine; p is valid only during the
	// call. nil drops them.
	DeliverForward func(from uint64, p []byte)
	// MaxQueueBytes bounds each peer's queue of messages not yet written
	// (default 64 MiB, design §6.1, or two frames); MaxFrameBytes bounds a
	// frame, read or written (default 65 MiB, above the largest entry a
	// publish makes; a bigger message is dropped).
	MaxQueueBytes int
	MaxFrameBytes int
	// SpoolDir is where snapshots being received are spooled (snapshot.go;
	// "": os.TempDir()). Spool files left there by a crash are removed by
	// New.
	SpoolDir string
	// MaxSnapshotBytes bounds a snapshot received, on disk in SpoolDir
	// (default 64 GiB); MaxSpools bounds the snapshots spooled or not yet
	// released at once (default 4; snapshot.go); SnapshotMemBytes is the
	// most entry bytes a snapshot received has read into memory (default
	// 64 MiB; a bigger one is read from its file as it is installed).
	MaxSnapshotBytes int64
	MaxSpools        int
	SnapshotMemBytes int64
	// ManualFlush: Send only queues, and Flush (the shard, after its
	// Round) hands every peer's queue to its writer, so a round's
	// messages to a peer go as one frame (design §3.2, transport.flush).
	// Without it each Send wakes the writers it queued for.
	ManualFlush bool
	// Handle answers a Call from node from (authenticated by the secret,
	// not necessarily a peer: a node asking to join); its error goes back
	// as text. nil: calls are refused.
	Handle func(from uint64, op byte, body []byte) ([]byte, error)
	// OnRemoved hears that a peer refused this node because it was
	// removed from the cluster (SetPeers' removed on that peer).
	OnRemoved func(reason string)
	Logger    *slog.Logger
}

// errPeerClosed: the peer closed a connection this node writes to.
var errPeerClosed = errors.New("cluster: the peer closed the connection")

// MinSecretLen is the shortest cluster secret accepted.
const MinSecretLen = 16

const (
	handshakeTimeout = 5 * time.Second
	writeTimeout     = 10 * time.Second
	maxHandshakes    = 16 // unauthenticated connections held at once
	minBackoff       = 50 * time.Millisecond
	maxBackoff       = 2 * time.Second
)

// Stats are a transport's counters.
type Stats struct {
	Connected    int    // peers with an authenticated outgoing connection
	Frames       uint64 // raft frames written
	Sent         uint64 // raft messages written
	Received     uint64 // raft messages delivered
	Dropped      uint64 // messages dropped (queue full, unknown peer, too big, lost with a connection)
	AuthFailures uint64 // handshakes that failed the secret check (either side)
	Refused      uint64 // inbound connections refused (bad hello, unknown node, handshake limit, bad frame)
	SnapsRefused uint64 // snapshots refused on arrival (MaxSpools, maxSpoolsPerPeer, no spool file, a spool write failed)
}

// PeerStats are one peer's.
type PeerStats struct {
	Connected     bool // the control connection (raft messages)
	DataConnected bool // the data connection (forwards, snapshots)
	QueuedBytes   int
	Sent          uint64
	Dropped       uint64
}

// Transport is the TCP transport. Send is safe for concurrent use.
type Transport struct {
	cfg    Config
	ln     net.Listener
	pmu    sync.RWMutex
	peers  map[uint64]*peer // pmu; SetPeers replaces it
	gone   map[uint64]bool  // pmu: removed from the cluster
	closed chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	hs     chan struct{} // handshake slots
	log    *slog.Logger

	mu      sync.Mutex
	inbound map[inboundKey]net.Conn
	conns   map[net.Conn]struct{} // inbound, for Close

	frames, sent, received, dropped, authFailures, refused atomic.Uint64
	refusedSnaps                                           atomic.Uint64

	smu      sync.Mutex
	spools   int            // smu: snapshots spooled or not yet released
	spoolsBy map[uint64]int // smu: of them, by sending peer
	// createSpool, if set (tests), creates a spool file instead of
	// os.CreateTemp in Config.SpoolDir. Set before any snapshot arrives.
	createSpool func() (*os.File, error)
}

// inboundKey names an inbound connection: one per peer and lane.
type inboundKey struct {
	from uint64
	lane byte
}

// New checks cfg, listens, and starts a writer per peer (which dials at
// once) and the accept loop.
func New(cfg Config) (*Transport, error) {
	if cfg.NodeID == 0 {
		return nil, errors.New("cluster: the node id must be a number from 1 (--node-id)")
	}
	if cfg.Deliver == nil {
		return nil, errors.New("cluster: Config.Deliver is required")
	}
	others := 0
	for id := range cfg.Peers {
		if id == 0 {
			return nil, errors.New("cluster: a peer with node id 0 (ids start at 1)")
		}
		if id != cfg.NodeID {
			others++
		}
	}
	if others > 0 {
		if _, ok := cfg.Peers[cfg.NodeID]; !ok {
			return nil, fmt.Errorf("cluster: this node's id %d is not in --peers: list every node, this one included", cfg.NodeID)
		}
		if len(cfg.Secret) == 0 {
			return nil, errors.New("cluster: a multi-node cluster needs a shared secret: put one (at least 16 bytes) in a file named by --cluster-secret-file, or in WARREN_CLUSTER_SECRET, the same on every node")
		}
		if len(cfg.Secret) < MinSecretLen {
			return nil, fmt.Errorf("cluster: the cluster secret has %d bytes; it needs at least %d bytes", len(cfg.Secret), MinSecretLen)
		}
	}
	if cfg.MaxFrameBytes <= 0 {
		// Above the largest entry a publish can make (one message of a
		// native frame at its hard limit, or a 16 MiB AMQP body, with its
		// headers): a raft message over the limit is dropped at every
		// retry, and its group stalls.
		cfg.MaxFrameBytes = wire.HardMaxFrame + 1<<20
	}
	if cfg.MaxQueueBytes <= 0 {
		cfg.MaxQueueBytes = max(64<<20, 2*cfg.MaxFrameBytes) // room for the largest message and more
	}
	if cfg.MaxSnapshotBytes <= 0 {
		cfg.MaxSnapshotBytes = 64 << 30
	}
	if cfg.MaxSpools <= 0 {
		cfg.MaxSpools = 4
	}
	if cfg.SnapshotMemBytes <= 0 {
		cfg.SnapshotMemBytes = 64 << 20
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = os.TempDir()
	} else {
		if err := os.MkdirAll(cfg.SpoolDir, 0o700); err != nil {
			return nil, fmt.Errorf("cluster: the snapshot spool directory: %w", err)
		}
		old, _ := filepath.Glob(filepath.Join(cfg.SpoolDir, spoolPattern))
		for _, f := range old { // a crash's: nothing is received before New
			os.Remove(f)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ln := cfg.Listener
	if ln == nil {
		addr := cfg.Listen
		if addr == "" {
			addr = cfg.Peers[cfg.NodeID]
		}
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("cluster: listen on %s: %w", addr, err)
		}
	}
	t := &Transport{cfg: cfg, ln: ln, peers: map[uint64]*peer{}, closed: make(chan struct{}),
		hs: make(chan struct{}, maxHandshakes), log: cfg.Logger,
		inbound: map[inboundKey]net.Conn{}, conns: map[net.Conn]struct{}{}, spoolsBy: map[uint64]int{}}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for id, addr := range cfg.Peers {
		if id == cfg.NodeID {
			continue
		}
		t.peers[id] = newPeer(t, id, addr)
	}
	t.gone = map[uint64]bool{}
	for _, p := range t.peers {
		t.wg.Add(2)
		p.start()
	}
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

// Addr is the address the transport listens on.
func (t *Transport) Addr() net.Addr { return t.ln.Addr() }

// Close stops the transport: the listener, every connection and
// goroutine. What is queued is dropped.
func (t *Transport) Close() error {
	select {
	case <-t.closed:
		return nil
	default:
	}
	close(t.closed)
	// SetPeers starts writers under pmu after checking closed: once this
	// lock is passed, none starts, and Wait below sees every one started.
	t.pmu.Lock()
	t.pmu.Unlock()
	t.cancel()
	err := t.ln.Close()
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	for _, p := range t.peerList() {
		p.closeConns()
	}
	t.wg.Wait()
	return err
}

func (t *Transport) peer(id uint64) *peer {
	t.pmu.RLock()
	defer t.pmu.RUnlock()
	return t.peers[id]
}

func (t *Transport) peerList() []*peer {
	t.pmu.RLock()
	defer t.pmu.RUnlock()
	ps := make([]*peer, 0, len(t.peers))
	for _, p := range t.peers {
		ps = append(ps, p)
	}
	return ps
}

// SetPeers changes the cluster's nodes (membership changes): a node not
// known yet is dialled, one no longer listed is dropped (what was queued
// for it too, and its inbound connection closed), one whose address
// changed is dialled there. Nodes in removed are refused with a reason
// that tells them (OnRemoved on their side). This node's own entry is
// ignored.
func (t *Transport) SetPeers(peers map[uint64]string, removed []uint64) {
	t.pmu.Lock()
	select {
	case <-t.closed:
		t.pmu.Unlock()
		return
	default:
	}
	var start, drop []*peer
	next := make(map[uint64]*peer, len(peers))
	for id, addr := range peers {
		if id == t.cfg.NodeID || id == 0 {
			continue
		}
		if p := t.peers[id]; p != nil && p.addr == addr {
			next[id] = p
			continue
		}
		p := newPeer(t, id, addr)
		next[id] = p
		start = append(start, p)
	}
	for id, p := range t.peers {
		if next[id] != p {
			drop = append(drop, p)
		}
	}
	t.peers = next
	for _, id := range removed {
		t.gone[id] = true
	}
	t.wg.Add(2 * len(start))
	t.pmu.Unlock()
	for _, p := range drop {
		close(p.stop)
		p.closeConns()
		if next[p.id] == nil {
			t.mu.Lock()
			for _, l := range []byte{laneControl, laneData} {
				if c := t.inbound[inboundKey{p.id, l}]; c != nil {
					c.Close()
				}
			}
			t.mu.Unlock()
		}
	}
	for _, p := range start {
		p.start()
	}
}

// Send queues msgs (of group gid) for their peers (m.To) and wakes their
// writers. It never blocks on the network: a message for a peer whose
// queue is full, for an unknown peer, or over the frame limit is dropped
// and counted.
func (t *Transport) Send(gid uint64, msgs []raftpb.Message) {
	var woken *peer
	t.pmu.RLock()
	defer t.pmu.RUnlock()
	for i := range msgs {
		m := &msgs[i]
		p := t.peers[m.To]
		size := m.Size()
		if p == nil || 12+size+1 > t.cfg.MaxFrameBytes {
			t.dropped.Add(1)
			if p != nil {
				p.dropped.Add(1)
			}
			continue
		}
		p.mu.Lock()
		if len(p.pending)+12+size > t.cfg.MaxQueueBytes {
			p.mu.Unlock()
			p.dropped.Add(1)
			t.dropped.Add(1)
			continue
		}
		off := len(p.pending)
		p.pending = grow(p.pending, 12+size)
		binary.BigEndian.PutUint64(p.pending[off:], gid)
		binary.BigEndian.PutUint32(p.pending[off+8:], uint32(size))
		if _, err := m.MarshalTo(p.pending[off+12:]); err != nil {
			p.pending = p.pending[:off]
			p.mu.Unlock()
			p.dropped.Add(1)
			t.dropped.Add(1)
			continue
		}
		p.count++
		p.mu.Unlock()
		if p != woken && !t.cfg.ManualFlush {
			select {
			case p.ctl.wake <- struct{}{}:
			default:
			}
			woken = p
		}
	}
}

// Flush wakes the writer of every peer with messages queued (with
// ManualFlush: once per round, after it). Safe for concurrent use.
func (t *Transport) Flush() {
	for _, p := range t.peerList() {
		p.mu.Lock()
		n := p.count
		p.mu.Unlock()
		if n > 0 {
			select {
			case p.ctl.wake <- struct{}{}:
			default:
			}
		}
	}
}

func grow(b []byte, n int) []byte {
	if len(b)+n <= cap(b) {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// Stats returns the transport's counters.
func (t *Transport) Stats() Stats {
	s := Stats{Frames: t.frames.Load(), Sent: t.sent.Load(), Received: t.received.Load(),
		Dropped: t.dropped.Load(), AuthFailures: t.authFailures.Load(), Refused: t.refused.Load(), SnapsRefused: t.refusedSnaps.Load()}
	for _, p := range t.peerList() {
		if p.ctl.connected.Load() {
			s.Connected++
		}
	}
	return s
}

// PeerStats returns peer id's counters (zero for an unknown peer).
func (t *Transport) PeerStats(id uint64) PeerStats {
	p := t.peer(id)
	if p == nil {
		return PeerStats{}
	}
	p.mu.Lock()
	q := len(p.pending)
	p.mu.Unlock()
	return PeerStats{Connected: p.ctl.connected.Load(), DataConnected: p.dat.connected.Load(), QueuedBytes: q, Sent: p.sent.Load(), Dropped: p.dropped.Load()}
}
