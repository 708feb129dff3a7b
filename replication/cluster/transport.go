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
package cluster

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
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

type peer struct {
	t    *Transport
	id   uint64
	addr string
	stop chan struct{} // closed when SetPeers drops the peer
	// The two connections: ctl writes pending (raft messages), dat writes
	// snaps and fwds.
	ctl, dat lane

	mu       sync.Mutex
	pending  []byte // entries: gid u64 | len u32 | message
	count    int    // messages in pending
	snaps    []pendingSnap
	fwds     [][]byte // forward.go
	fwdBytes int
	spare    []byte

	sent    atomic.Uint64
	dropped atomic.Uint64
}

// lane is one of a peer's connections and its writer.
type lane struct {
	id        byte // laneControl or laneData
	wake      chan struct{}
	conn      net.Conn // peer.mu
	connected atomic.Bool
}

func newPeer(t *Transport, id uint64, addr string) *peer {
	return &peer{t: t, id: id, addr: addr, stop: make(chan struct{}),
		ctl: lane{id: laneControl, wake: make(chan struct{}, 1)},
		dat: lane{id: laneData, wake: make(chan struct{}, 1)}}
}

// start starts the peer's writers (t.wg counts them: 2).
func (p *peer) start() {
	go p.run(&p.ctl)
	go p.run(&p.dat)
}

// closeConns closes both connections (their writers then dial again, or
// stop).
func (p *peer) closeConns() {
	p.mu.Lock()
	for _, l := range []*lane{&p.ctl, &p.dat} {
		if l.conn != nil {
			l.conn.Close()
		}
	}
	p.mu.Unlock()
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

// mac is HMAC-SHA256(secret) over the handshake: who speaks (label),
// both nonces and both node ids, so a proof cannot be replayed on another
// connection or reflected back.
func (t *Transport) mac(label string, nc, ns *[nonceSize]byte, dialer, to, listener uint64) []byte {
	h := hmac.New(sha256.New, t.cfg.Secret)
	h.Write([]byte(label))
	h.Write([]byte{version})
	h.Write(nc[:])
	h.Write(ns[:])
	var ids [24]byte
	binary.BigEndian.PutUint64(ids[:], dialer)
	binary.BigEndian.PutUint64(ids[8:], to)
	binary.BigEndian.PutUint64(ids[16:], listener)
	h.Write(ids[:])
	return h.Sum(nil)
}

func refuse(c net.Conn, reason string) {
	c.Write(appendFrame(nil, kindRefuse, []byte(reason)))
}

// run is the writer of lane l: dial, then write what is queued for it,
// forever.
func (p *peer) run(l *lane) {
	defer p.t.wg.Done()
	if l.id == laneData {
		defer p.dropSnaps() // stopped or closed: raft hears the snapshots failed (ReportSnapshot)
	}
	name := "control"
	if l.id == laneData {
		name = "data"
	}
	backoff := minBackoff
	failing := false
	for {
		conn, err := p.dial(l.id)
		if err != nil {
			if p.isClosed() {
				return
			}
			if !failing {
				p.t.log.Warn("cluster: cannot reach peer; retrying with backoff", "peer", p.id, "addr", p.addr, "connection", name, "err", err)
				failing = true
			} else {
				p.t.log.Debug("cluster: cannot reach peer", "peer", p.id, "err", err)
			}
			j, _ := rand.Int(rand.Reader, big.NewInt(int64(backoff/2)+1))
			tm := time.NewTimer(backoff/2 + time.Duration(j.Int64()))
			select {
			case <-tm.C:
			case <-p.t.closed:
				tm.Stop()
				return
			case <-p.stop:
				tm.Stop()
				return
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		failing, backoff = false, minBackoff
		p.t.log.Info("cluster: connected to peer", "peer", p.id, "addr", p.addr, "connection", name)
		p.mu.Lock()
		l.conn = conn
		p.mu.Unlock()
		if p.isClosed() {
			conn.Close()
			return
		}
		l.connected.Store(true)
		// The listener sends nothing after OK but a refusal: reading
		// notices a connection the peer closed, and closes ours so the
		// next write fails at once.
		// It also wakes the writer (dead), which dials again at once:
		// otherwise an idle connection's loss is found by the next write,
		// and what that write carries is lost (a peer that restarted would
		// lose the first forwards sent to it).
		dead := make(chan struct{})
		go func() {
			var b [64]byte
			for {
				if _, err := conn.Read(b[:]); err != nil {
					conn.Close()
					close(dead)
					return
				}
			}
		}()
		if l.id == laneData {
			err = p.writeData(conn, dead)
		} else {
			err = p.write(conn, dead)
		}
		l.connected.Store(false)
		conn.Close()
		p.mu.Lock()
		l.conn = nil
		p.mu.Unlock()
		if p.isClosed() {
			return
		}
		p.t.log.Warn("cluster: lost the connection to peer; reconnecting", "peer", p.id, "connection", name, "err", err)
	}
}

func (p *peer) isClosed() bool {
	select {
	case <-p.t.closed:
		return true
	case <-p.stop:
		return true
	default:
		return false
	}
}

// writeData sends the snapshots and forwards queued each time
// SendSnapshot or SendForward wakes the data lane.
func (p *peer) writeData(conn net.Conn, dead <-chan struct{}) error {
	for {
		select {
		case <-dead:
			return errPeerClosed
		case <-p.dat.wake:
		case <-p.t.closed:
			return nil
		case <-p.stop:
			return nil
		}
		p.mu.Lock()
		snaps := p.snaps
		p.snaps = nil
		p.mu.Unlock()
		if err := p.writeSnaps(conn, snaps); err != nil {
			return err
		}
		if err := p.writeFwds(conn); err != nil {
			return err
		}
	}
}

// writeFwds writes the forwards queued (also between a snapshot's
// frames: a big snapshot does not hold them up).
func (p *peer) writeFwds(conn net.Conn) error {
	p.mu.Lock()
	fwds := p.fwds
	p.fwds, p.fwdBytes = nil, 0
	p.mu.Unlock()
	if len(fwds) == 0 {
		return nil
	}
	var bufs net.Buffers
	for _, f := range fwds {
		bufs = append(bufs, appendFrameHeader(nil, kindFwd, len(f)), f)
	}
	conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := bufs.WriteTo(conn); err != nil {
		p.dropped.Add(uint64(len(fwds)))
		p.t.dropped.Add(uint64(len(fwds)))
		return err
	}
	p.t.frames.Add(uint64(len(fwds)))
	return nil
}

// write sends the raft messages queued each time Send (or Flush) wakes
// the control lane: one frame per wake (several if it would pass the
// frame limit), with writev.
func (p *peer) write(conn net.Conn, dead <-chan struct{}) error {
	var hdrs []byte
	var bufs net.Buffers
	for {
		select {
		case <-dead:
			return errPeerClosed
		case <-p.ctl.wake:
		case <-p.t.closed:
			return nil
		case <-p.stop:
			return nil
		}
		p.mu.Lock()
		buf, n := p.pending, p.count
		p.pending, p.count = p.spare[:0], 0
		p.spare = nil
		p.mu.Unlock()
		if n == 0 {
			p.recycle(buf)
			continue
		}
		// Split into frames of at most MaxFrameBytes at entry bounds.
		hdrs, bufs = hdrs[:0], bufs[:0]
		frames := 0
		for start := 0; start < len(buf); {
			end := start
			for end < len(buf) {
				l := 12 + int(binary.BigEndian.Uint32(buf[end+8:]))
				if end > start && end-start+l+1 > p.t.cfg.MaxFrameBytes {
					break
				}
				end += l
			}
			hdrs = binary.BigEndian.AppendUint32(hdrs, uint32(end-start+1))
			hdrs = append(hdrs, kindRaft)
			start = end
			frames++
		}
		for i, start := 0, 0; i < frames; i++ {
			l := int(binary.BigEndian.Uint32(hdrs[5*i:])) - 1
			bufs = append(bufs, hdrs[5*i:5*i+5], buf[start:start+l])
			start += l
		}
		conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		w := bufs
		_, err := w.WriteTo(conn)
		if err != nil {
			p.dropped.Add(uint64(n))
			p.t.dropped.Add(uint64(n))
			p.recycle(buf)
			return err
		}
		p.sent.Add(uint64(n))
		p.t.sent.Add(uint64(n))
		p.t.frames.Add(uint64(frames))
		p.recycle(buf)
	}
}

// recycle keeps buf as the next spare unless it is over 1 MiB.
func (p *peer) recycle(buf []byte) {
	if cap(buf) > 1<<20 {
		return
	}
	p.mu.Lock()
	p.spare = buf[:0]
	p.mu.Unlock()
}

// dial connects lane l to the peer and runs the dialer's side of the
// handshake.
func (p *peer) dial(l byte) (net.Conn, error) {
	d := net.Dialer{Timeout: handshakeTimeout}
	conn, err := d.DialContext(p.t.ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	if _, err := p.t.handshake(conn, p.id, p.addr, l); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// handshake runs the dialer's side on conn (for lane l) to node id at
// addr (id 0: a call to whichever node listens there); it returns the
// listener's id.
func (t *Transport) handshake(conn net.Conn, id uint64, addr string, l byte) (uint64, error) {
	p := struct {
		id   uint64
		addr string
	}{id, addr}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	h := hello{version: version, from: t.cfg.NodeID, to: p.id, lane: l}
	rand.Read(h.nonce[:])
	if _, err := conn.Write(appendHello(nil, h)); err != nil {
		return 0, err
	}
	var buf []byte
	kind, pl, err := readFrame(conn, &buf, 4096)
	if err != nil {
		return 0, err
	}
	if kind == kindRefuse {
		// Not authenticated yet: whoever answers on p's address may say
		// anything. Only a refusal after the listener proved the secret
		// (below) may tell this node it was removed.
		return 0, fmt.Errorf("peer %d at %s refused this node: %s", p.id, p.addr, pl)
	}
	if kind != kindChall || len(pl) != 1+8+nonceSize+sha256.Size {
		return 0, fmt.Errorf("peer %d at %s: not a Warren cluster handshake", p.id, p.addr)
	}
	if pl[0] != version {
		return 0, fmt.Errorf("peer %d speaks cluster protocol version %d, this node %d: run the same Warren version on every node", p.id, pl[0], version)
	}
	from := binary.BigEndian.Uint64(pl[1:])
	if p.id == 0 {
		p.id = from
	} else if from != p.id {
		return 0, fmt.Errorf("%s is node %d, not node %d: check --peers", p.addr, from, p.id)
	}
	var ns [nonceSize]byte
	copy(ns[:], pl[9:])
	if !hmac.Equal(pl[9+nonceSize:], t.mac("listener", &h.nonce, &ns, t.cfg.NodeID, h.to, p.id)) {
		t.authFailures.Add(1)
		refuse(conn, "authentication failed: the cluster secrets differ")
		return 0, fmt.Errorf("peer %d at %s failed authentication: its cluster secret differs from this node's", p.id, p.addr)
	}
	if _, err := conn.Write(appendFrame(nil, kindProof, t.mac("dialer", &h.nonce, &ns, t.cfg.NodeID, h.to, p.id))); err != nil {
		return 0, err
	}
	kind, pl, err = readFrame(conn, &buf, 4096)
	if err != nil {
		return 0, err
	}
	if kind == kindRefuse {
		if bytes.Contains(pl, []byte(removedReason)) && t.cfg.OnRemoved != nil {
			t.cfg.OnRemoved(string(pl))
		}
		return 0, fmt.Errorf("peer %d at %s refused this node: %s", p.id, p.addr, pl)
	}
	if kind != kindOK {
		return 0, fmt.Errorf("peer %d at %s: unexpected frame kind %d in the handshake", p.id, p.addr, kind)
	}
	conn.SetDeadline(time.Time{})
	return p.id, nil
}

func (t *Transport) accept() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			select {
			case <-t.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			t.log.Error("cluster: accept failed; the cluster listener stops", "err", err)
			return
		}
		select {
		case t.hs <- struct{}{}:
		default:
			t.refused.Add(1)
			c.Close()
			continue
		}
		t.mu.Lock()
		select {
		case <-t.closed:
			t.mu.Unlock()
			c.Close()
			return
		default:
		}
		t.conns[c] = struct{}{}
		t.mu.Unlock()
		t.wg.Add(1)
		go t.serve(c)
	}
}

// dropSnaps tells every snapshot still queued for p that it was not sent:
// raft then leaves the follower's snapshot state and may try again.
func (p *peer) dropSnaps() {
	p.mu.Lock()
	snaps := p.snaps
	p.snaps = nil
	p.mu.Unlock()
	for _, s := range snaps {
		s.done(false)
	}
}

// serve runs the listener's side of the handshake on c, then reads its
// raft frames.
func (t *Transport) serve(c net.Conn) {
	defer t.wg.Done()
	defer func() {
		c.Close()
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}()
	from, call, l, err := t.accepted(c)
	<-t.hs
	if err != nil {
		t.log.Warn("cluster: refused a connection", "remote", c.RemoteAddr(), "err", err)
		return
	}
	if call {
		t.serveCall(c, from)
		return
	}
	key := inboundKey{from, l}
	t.mu.Lock()
	if old := t.inbound[key]; old != nil {
		old.Close() // the peer reconnected: one inbound connection per peer and lane
	}
	t.inbound[key] = c
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		if t.inbound[key] == c {
			delete(t.inbound, key)
		}
		t.mu.Unlock()
	}()
	var buf []byte
	var snap *spool                            // a snapshot being received
	defer func() { t.dropSpool(from, snap) }() // partial: never delivered
	for {
		kind, pl, err := readFrame(c, &buf, t.cfg.MaxFrameBytes)
		if err == nil && kind != kindRaft && kind != kindSnap && kind != kindFwd {
			err = fmt.Errorf("cluster: a frame of kind %d after the handshake", kind)
		}
		if err == nil && kind == kindSnap {
			err = t.snapFrame(from, pl, &snap)
		} else if err == nil && kind == kindFwd { // (between a snapshot's frames too)
			t.received.Add(1)
			if t.cfg.DeliverForward != nil {
				t.cfg.DeliverForward(from, pl)
			}
		} else if err == nil && snap != nil {
			err = errors.New("cluster: a raft frame inside a snapshot's frames")
		} else if err == nil {
			err = eachMessage(pl, func(gid uint64, b []byte) error {
				var m raftpb.Message
				if err := m.Unmarshal(b); err != nil {
					return fmt.Errorf("cluster: a raft message that does not decode: %w", err)
				}
				if m.From != from {
					return fmt.Errorf("cluster: node %d sent a message from node %d", from, m.From)
				}
				t.received.Add(1)
				t.cfg.Deliver(gid, m)
				return nil
			})
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				select {
				case <-t.closed:
				default:
					t.refused.Add(1)
					t.log.Warn("cluster: closing a peer's connection", "peer", from, "err", err)
				}
			}
			return
		}
		if cap(buf) > 1<<20 {
			buf = nil
		}
	}
}

// accepted runs the handshake; it returns the authenticated peer's id,
// whether the connection is a call (Call: the hello named no node), and
// its lane.
func (t *Transport) accepted(c net.Conn) (uint64, bool, byte, error) {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	var buf []byte
	kind, pl, err := readFrame(c, &buf, 4096)
	if err != nil {
		t.refused.Add(1)
		return 0, false, 0, err
	}
	if kind != kindHello {
		t.refused.Add(1)
		refuse(c, "expected a hello")
		return 0, false, 0, fmt.Errorf("cluster: frame kind %d before the hello", kind)
	}
	h, err := parseHello(pl)
	if err == nil && h.to != t.cfg.NodeID && h.to != 0 {
		err = fmt.Errorf("cluster: this is node %d, not node %d: check --peers on node %d", t.cfg.NodeID, h.to, h.from)
	}
	t.pmu.RLock()
	known, gone := t.peers[h.from] != nil, t.gone[h.from]
	t.pmu.RUnlock()
	if err == nil && !known && !gone && h.to != 0 {
		err = fmt.Errorf("cluster: node %d is not a member of this node's cluster", h.from)
	}
	if err != nil {
		t.refused.Add(1)
		refuse(c, err.Error())
		return 0, false, 0, err
	}
	var ns [nonceSize]byte
	rand.Read(ns[:])
	p := make([]byte, 0, 1+8+nonceSize+sha256.Size)
	p = append(p, version)
	p = binary.BigEndian.AppendUint64(p, t.cfg.NodeID)
	p = append(p, ns[:]...)
	p = append(p, t.mac("listener", &h.nonce, &ns, h.from, h.to, t.cfg.NodeID)...)
	if _, err := c.Write(appendFrame(nil, kindChall, p)); err != nil {
		return 0, false, 0, err
	}
	kind, pl, err = readFrame(c, &buf, 4096)
	if err != nil {
		return 0, false, 0, err
	}
	if kind == kindRefuse {
		t.authFailures.Add(1)
		return 0, false, 0, fmt.Errorf("cluster: node %d refused this node: %s", h.from, pl)
	}
	if kind != kindProof || !hmac.Equal(pl, t.mac("dialer", &h.nonce, &ns, h.from, h.to, t.cfg.NodeID)) {
		t.authFailures.Add(1)
		refuse(c, "authentication failed: the cluster secrets differ")
		return 0, false, 0, fmt.Errorf("cluster: node %d failed authentication: its cluster secret differs from this node's", h.from)
	}
	if gone {
		// Told only once the dialer proved the secret, and so believed
		// (the dialer stops for good on it: OnRemoved).
		err := fmt.Errorf("cluster: node %d %s (node ids are never reused)", h.from, removedReason)
		t.refused.Add(1)
		refuse(c, err.Error())
		return 0, false, 0, err
	}
	if _, err := c.Write(appendFrame(nil, kindOK, nil)); err != nil {
		return 0, false, 0, err
	}
	c.SetDeadline(time.Time{})
	return h.from, h.to == 0, h.lane, nil
}
