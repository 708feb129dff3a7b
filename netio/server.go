package netio

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/internal/ratelog"
	"github.com/warren-mq/warren/segment"

	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// Version is the broker's version, sent in HELLO.
const Version = "0.1.0"

// Config is the broker's configuration. Zero values take the defaults
// noted on each field.
type Config struct {
	Addr              string // "127.0.0.1:5680"; port 0 picks a free one
	Users             []User // besides guest/guest from loopback
	DisableGuest      bool   // refuse guest/guest even from loopback
	MaxFrame          uint32 // proposed max frame size; wire.DefaultMaxFrame
	MaxChannels       uint16 // per connection; 2047
	HeartbeatMs       uint32 // proposed heartbeat; 30000 (0 keeps the default; use Heartbeat < 0 to disable)
	DisableHeartbeats bool   // propose no heartbeats
	MaxConnections    int    // 10000
	MaxPrefetch       uint32 // cap on a consumer's unacked deliveries (and auto-ack window); 1000
	MaxOutboundBytes  int    // per-connection outbox cap before the connection is closed; 64 MiB
	MemoryHighWater   int64  // stored message bytes (and Go heap growth) that pause publishers; DefaultMemoryHighWater
	QueueSoftLimit    int64  // ready messages above which a queue holds back its publishers' confirms; 20,000 (-1: never)
	// DiskFreeLimit: below this many free bytes on DataDir's filesystem
	// the disk alarm blocks publishers (as the memory alarm does) until
	// the free space is back above it; DefaultDiskFreeLimit (2 GiB); -1:
	// off. Checked on the tick every DiskCheckInterval (1s) with DiskFree
	// (nil: statfs of DataDir; no check without a DataDir).
	DiskFreeLimit     int64
	DiskCheckInterval time.Duration
	DiskFree          func() (free int64, ok bool)
	// MaxQueues, MaxExchanges, MaxBindings bound what the broker holds
	// (broker.MetaLimits; 0: 1,000,000 queues, 100,000 exchanges,
	// 4,000,000 bindings): a declare or bind past one is refused with
	// resource_limit. MaxExclusivePerConnection: the exclusive queues one
	// connection may own (0: 10,000).
	MaxQueues, MaxExchanges, MaxBindings int
	MaxExclusivePerConnection            int
	Shards                               int           // queue shards; GOMAXPROCS
	EventLoops                           int           // gnet loops; GOMAXPROCS
	TickInterval                         time.Duration // heartbeat and flow checks; 100ms
	Logger                               *slog.Logger  // discard if nil

	// MaxConsumersPerConnection: the consumers one connection may have
	// on its queues at once, on every channel together, a cancelled one
	// counting until its queue has let it go (its deliveries settled or
	// taken back); a SUBSCRIBE (AMQP: basic.consume, basic.get) past it
	// is refused with limit_reached. 0: 10,000.
	MaxConsumersPerConnection int

	// Connections before they authenticate (see connlimits.go).

	// HandshakeTimeout bounds the time from accept to OPEN_OK; 10s.
	HandshakeTimeout time.Duration
	// MaxUnauthenticated caps the connections that have not yet
	// authenticated, a cap of their own below MaxConnections; 1000.
	MaxUnauthenticated int
	// MaxConnectionsPerSource caps the connections from one source IP
	// address; 0: no cap.
	MaxConnectionsPerSource int
	// ProxyTrusted lists the peers (CIDRs) whose PROXY protocol (v1 or v2)
	// header is accepted; empty: the PROXY protocol is off.
	ProxyTrusted []netip.Prefix

	// TLSAddr, if set, opens a listener for the native protocol over TLS
	// (tls.go), served by the same loops and bounds as the plain one, with
	// TLSConfig (required with it; a GetConfigForClient that returns the
	// current files lets certificates change between handshakes:
	// internal/tlsfiles). TLS 1.2 is the minimum whatever it says. With
	// ClientCAs and a ClientAuth that verifies a certificate given, HELLO
	// on a connection with a verified certificate also offers EXTERNAL.
	TLSAddr   string
	TLSConfig *tls.Config
	// DisablePlain: no plaintext listener (Addr is ignored); needs TLSAddr.
	DisablePlain bool

	// DataDir, if set, holds the node's log (DataDir/log): Start recovers
	// the topology from it before the listener opens, and every topology
	// change is logged and answered once on disk (broker.OpenNodeLog,
	// Broker.OpenMetaLog).
	// Empty: everything in memory, as before.
	DataDir string
	// Fatal hears that a write of the log failed: the node must stop and
	// recover from the log (warrend exits non-zero). nil: logged only.
	Fatal func(error)
	// A cluster (several nodes, with a DataDir): NodeID is this node's
	// id, MetaPeers every node's (this one included), RaftSend carries
	// raft messages to the peers (a cluster.Transport), and OnBroker is
	// given the broker before its recovery, so the transport can hand it
	// what peers send (Broker.StepRaft). Start returns once the metadata
	// group has a leader and this node has applied what it committed
	// (Broker.WaitMetaReady), or ClusterCtx is done.
	NodeID    uint64
	MetaPeers []uint64
	RaftSend  func(gid uint64, msgs []raftpb.Message)
	// RaftSendSnapshot sends a replicated queue's snapshot to a peer
	// that fell behind (cluster.Transport.SendSnapshot).
	RaftSendSnapshot func(gid uint64, s *broker.SnapshotMessage, done func(ok bool))
	// RaftForward sends forwarded work to a peer (cluster.Transport.SendForward):
	// publishes to a replicated queue led by another node go to it.
	RaftForward func(to uint64, p []byte) bool
	OnBroker    func(*broker.Broker)
	ClusterCtx  context.Context
	// Membership: the metadata group's membership hooks (a node that
	// joins has Membership.Join and no MetaPeers).
	Membership broker.Membership

	// clock is the broker's one clock source (ms), which stamps the
	// shards' commands; nil: the wall clock. Tests set a fake one.
	clock func() int64
}

// clustered: this node is one of a cluster (several peers, or joining).
func (c *Config) clustered() bool { return len(c.MetaPeers) > 1 || c.Membership.Join != nil }

func (c *Config) fill() {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:5680"
	}
	if c.MaxFrame == 0 {
		c.MaxFrame = wire.DefaultMaxFrame
	}
	if c.MaxChannels == 0 {
		c.MaxChannels = 2047
	}
	if c.HeartbeatMs == 0 && !c.DisableHeartbeats {
		c.HeartbeatMs = 30000
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = 10000
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = handshakeTimeoutDefault
	}
	if c.MaxUnauthenticated <= 0 {
		c.MaxUnauthenticated = 1000
	}
	if c.MaxPrefetch == 0 {
		c.MaxPrefetch = 1000
	}
	if c.MaxConsumersPerConnection <= 0 {
		c.MaxConsumersPerConnection = 10_000
	}
	if c.MaxOutboundBytes == 0 {
		c.MaxOutboundBytes = 64 << 20
	}
	if c.MemoryHighWater == 0 {
		c.MemoryHighWater = DefaultMemoryHighWater()
	}
	if c.QueueSoftLimit == 0 {
		c.QueueSoftLimit = 20_000
	}
	if c.DiskFreeLimit == 0 {
		c.DiskFreeLimit = DefaultDiskFreeLimit
	}
	if c.DiskCheckInterval <= 0 {
		c.DiskCheckInterval = time.Second
	}
	if c.Shards <= 0 {
		c.Shards = gomaxprocs()
	}
	if c.EventLoops <= 0 {
		c.EventLoops = gomaxprocs()
	}
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Server is a running broker.
type Server struct {
	gnet.BuiltinEventEngine
	cfg  Config
	log  *slog.Logger
	auth *authenticator
	// perms: the permissions in force (perms.go); permGen counts changes.
	perms   atomic.Pointer[permTable]
	permGen atomic.Uint64
	// userDeleted: OnUserDeleted's function, if set.
	userDeleted atomic.Pointer[func(user string)]
	// beforeOpen (tests) runs as an accepted connection is about to be
	// marked open, after its OPEN_OK is queued.
	beforeOpen atomic.Pointer[func(user string)]
	vh         vhostState // virtual hosts at run time (vhosts.go)
	// The broker core: topology, shards, the operator API (promoted:
	// DeclareQueue, PeekQueue…). netio holds it; it never calls netio.
	*broker.Broker

	eng  gnet.Engine
	addr net.Addr  // the plain listener's; nil with DisablePlain
	tls  *tlsFront // the TLS listener (Config.TLSAddr); nil without one
	// loopsUp is closed at the first tick, once the engine's loops run
	// (the TLS front enrolls connections only after it).
	loopsUp     chan struct{}
	loopsUpOnce sync.Once
	privateDir  string       // with DisablePlain: the directory of the engine's unreachable Unix socket
	nodeLog     *segment.Log // the node's log (Config.DataDir), closed last by Close
	booted      chan error
	stopped     chan struct{}
	closing     atomic.Bool
	connSeq     atomic.Uint64
	// bigDeliveryLog: consumers cancelled for a message over their
	// connection's max_frame (Deliver).
	bigDeliveryLog ratelog.Limiter
	downs          atomic.Uint64 // Down commands sent to the shards (tests read it)

	connsMu sync.Mutex
	conns   map[uint64]*conn
	adm     admission // (connsMu) connections before they authenticate

	flowOff    atomic.Bool
	flowWanted atomic.Bool // a publish was held back for crossing the watermark
	flowSent   bool        // FLOW(active=false) was last sent to everyone (tick goroutine)
	// The disk alarm (disklimit.go): diskFree reads the free space (nil:
	// no check); the tick goroutine alone writes the rest.
	diskFree      func() (int64, bool)
	diskAlarm     atomic.Bool
	diskFreeBytes atomic.Int64
	lastDiskCheck time.Time
	// The Go heap's live bytes when the broker started, and what the tick
	// (its only user) needs to read them again.
	heapBase   int64
	heapSample []rtmetrics.Sample
	lastHeapGC int64 // ms of the last collection the alarm asked for

	metrics serverMetrics

	changedMu sync.Mutex
	changed   chan struct{} // closed by notifyChanged; nil: nobody waits
}

// Changed returns a channel that is closed at the next change of the
// server's connection-side state: a connection accepted, its credentials
// checked, authenticated, blocked or unblocked by the memory alarm, or
// closed (once the Down of its queues and consumers has been submitted to
// the broker), a TLS handshake failed, the memory alarm raised or cleared. A test waits on it, with a deadline, for a condition on that
// state, instead of polling with sleeps; take the channel before reading
// the state, so a change in between is not missed.
func (s *Server) Changed() <-chan struct{} {
	s.changedMu.Lock()
	defer s.changedMu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// notifyChanged wakes whoever waits on Changed. Per connection event, never
// per message.
func (s *Server) notifyChanged() {
	s.changedMu.Lock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	s.changedMu.Unlock()
}

// nowMs reads the broker's one clock source.
func (s *Server) nowMs() int64 { return s.NowMs() }

// Start listens and runs the broker in the background. It returns once the
// listener is bound.
func Start(cfg Config) (*Server, error) {
	cfg.fill()
	if cfg.DisablePlain && cfg.TLSAddr == "" {
		return nil, errors.New("netio: the plain listener is off (DisablePlain) and there is no TLS listener (TLSAddr): nothing to serve on")
	}
	if cfg.TLSAddr != "" && cfg.TLSConfig == nil {
		return nil, errors.New("netio: TLSAddr is set without a TLSConfig (a certificate and its key)")
	}
	if cfg.clustered() && (cfg.NodeID == 0 || cfg.NodeID >= 1<<16) {
		return nil, fmt.Errorf("netio: node id %d: a cluster's node ids are from 1 to 65535", cfg.NodeID)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, booted: make(chan error, 1), stopped: make(chan struct{}), conns: map[uint64]*conn{}, loopsUp: make(chan struct{}),
		bigDeliveryLog: ratelog.Limiter{Every: 10 * time.Second}}
	s.heapSample = []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	s.heapBase = s.heapLive()
	switch {
	case cfg.DiskFreeLimit < 0:
	case cfg.DiskFree != nil:
		s.diskFree = cfg.DiskFree
	case cfg.DataDir != "":
		dir := cfg.DataDir
		s.diskFree = func() (int64, bool) { return diskFree(dir) }
	}
	s.auth = newAuthenticator(cfg.Users, !cfg.DisableGuest)
	s.auth.comparing = s.notifyChanged
	s.auth.log = s.log
	// The node's log (DataDir/log), opened before the broker: it is the
	// one log of the node, for the metadata group (and, with
	// broker.Config.Durable, the durable queues).
	var metaCfg broker.MetaLogConfig
	var durable *broker.DurableConfig
	var incarnation *broker.Incarnation
	if cfg.DataDir != "" {
		// The node's incarnation: above its earlier lives', whatever
		// the clock did across the restart (broker/incarnation.go). Read
		// before the log opens and written after, so that a start refused
		// for either leaves the data directory as it was.
		startMs := time.Now().UnixMilli()
		if cfg.clock != nil {
			startMs = cfg.clock()
		}
		var err error
		if incarnation, err = broker.ReadIncarnation(cfg.DataDir, startMs); err != nil {
			return nil, err
		}
		l, store, err := broker.OpenNodeLog(cfg.DataDir, s.log)
		if err != nil {
			return nil, err
		}
		if err := incarnation.Begin(); err != nil {
			_ = l.Close()
			return nil, err
		}
		fatal := cfg.Fatal
		if fatal == nil {
			fatal = func(err error) { s.log.Error("the log stopped; restart to recover", "err", err) }
		}
		metaCfg = broker.MetaLogConfig{Log: l, Snapshots: store, Fatal: fatal, NodeID: cfg.NodeID, Peers: cfg.MetaPeers, Send: cfg.RaftSend,
			Membership: cfg.Membership}
		durable = &broker.DurableConfig{Log: l, Snapshots: store, Fatal: fatal}
		if cfg.clustered() {
			durable.NodeID, durable.Send, durable.SendSnapshot, durable.Forward = cfg.NodeID, cfg.RaftSend, cfg.RaftSendSnapshot, cfg.RaftForward
			// Connection ids are the cluster's: node << 32 | a count, so
			// that an exclusive queue's owner (a connection id, in the
			// replicated metadata) names one connection in the cluster,
			// not the connection with that count on every node. Below
			// 1<<48: larger owner ids are forwarded consumers' (broker).
			s.connSeq.Store(cfg.NodeID << 32)
		}
		s.nodeLog = l
	}
	s.Broker = broker.New(broker.Config{Shards: cfg.Shards, QueueSoftLimit: cfg.QueueSoftLimit, Logger: cfg.Logger, Clock: cfg.clock,
		Limits: broker.MetaLimits{MaxQueues: cfg.MaxQueues, MaxExchanges: cfg.MaxExchanges, MaxBindings: cfg.MaxBindings,
			MaxExclusivePerConn: cfg.MaxExclusivePerConnection},
		DeadLetterDropped: func(r broker.DLDrop) { s.metrics.dlDropped[r].Inc() }, Durable: durable,
		// A publish forwarded here is held back as this node's own
		// publishers are (the memory or the disk alarm).
		PublishBlocked: s.memoryAlarm, Incarnation: incarnation})
	s.initMetrics()
	s.Broker.Start()
	if cfg.OnBroker != nil {
		cfg.OnBroker(s.Broker)
	}
	if s.nodeLog != nil {
		// Recovery: the listener opens only after it.
		if err := s.Broker.OpenMetaLog(context.Background(), metaCfg); err != nil {
			_ = s.Broker.Stop(context.Background())
			_ = s.nodeLog.Close()
			return nil, fmt.Errorf("recovering the topology from the log in %s: %w", cfg.DataDir, err)
		}
		if cfg.clustered() {
			s.log.Info("waiting for the cluster's metadata group: a leader, and this node caught up", "node", cfg.NodeID, "nodes", len(cfg.MetaPeers))
			ctx := cfg.ClusterCtx
			if ctx == nil {
				ctx = context.Background()
			}
			if err := s.Broker.WaitMetaReady(ctx); err != nil {
				_ = s.Broker.CloseMetaLog(context.Background())
				_ = s.Broker.Stop(context.Background())
				_ = s.nodeLog.Close()
				return nil, fmt.Errorf("waiting for the cluster: %w", err)
			}
			st, _ := s.Broker.MetaStatus()
			s.log.Info("the cluster's metadata group is ready", "leader", st.Leader, "term", st.Term, "applied", st.Applied)
		}
		// And the durable queues' messages, before anyone can ask (a
		// signal ends the wait, as it ends the cluster's).
		rctx := cfg.ClusterCtx
		if rctx == nil {
			rctx = context.Background()
		}
		if err := s.Broker.WaitRecovered(rctx); err != nil {
			_ = s.Broker.Stop(context.Background())
			_ = s.nodeLog.Close()
			return nil, fmt.Errorf("recovering the durable queues from the log in %s: %w", cfg.DataDir, err)
		}
	}
	// Users are the metadata state machine's (issue 15): the config
	// file's are created when absent, run-time changes win afterwards.
	if err := s.bootstrapUsers(cfg.Users); err != nil {
		_ = s.Broker.Stop(context.Background())
		if s.nodeLog != nil {
			_ = s.nodeLog.Close()
		}
		return nil, err
	}
	gnetAddr := "tcp://" + listenAddr(cfg.Addr)
	opts := []gnet.Option{gnet.WithMulticore(true), gnet.WithNumEventLoop(cfg.EventLoops), gnet.WithReusePort(false), gnet.WithReuseAddr(true),
		gnet.WithTicker(true), gnet.WithReadBufferCap(256 << 10), gnet.WithLogger(gnetLogger{s.log})}
	var tlsErr error
	if cfg.DisablePlain {
		// gnet needs a listener to run: a Unix socket in a private
		// directory, whose connections OnOpen refuses.
		s.privateDir, tlsErr = os.MkdirTemp("", "warren-noplain-")
		gnetAddr = "unix://" + filepath.Join(s.privateDir, "refused.sock")
	}
	// Engine.Register (the TLS front, other fronts: Enroll) picks a loop
	// from another goroutine than the acceptor's: round-robin is not safe
	// for that, least-connections only reads.
	opts = append(opts, gnet.WithLoadBalancing(gnet.LeastConnections))
	if cfg.TLSAddr != "" && tlsErr == nil {
		tlsErr = s.startTLS()
	}
	if tlsErr != nil {
		s.booted <- tlsErr
		close(s.stopped)
	} else {
		go func() {
			defer close(s.stopped)
			// SO_REUSEADDR: after a graceful stop the broker's closed
			// connections sit in TIME_WAIT on its port; a restart must still
			// bind (Go's net.Listen sets it too).
			err := gnet.Run(s, gnetAddr, opts...)
			select {
			case s.booted <- err:
			default:
			}
			if err == nil {
				err = errors.New("netio: engine stopped")
			}
			s.log.Debug("engine exited", "err", err)
		}()
	}
	if err := <-s.booted; err != nil {
		if s.tls != nil {
			s.tls.close()
		}
		s.removePrivateDir()
		_ = s.Broker.Stop(context.Background())
		_ = s.Broker.CloseMetaLog(context.Background())
		if s.nodeLog != nil {
			_ = s.nodeLog.Close()
		}
		if tlsErr != nil {
			return nil, fmt.Errorf("netio: TLS listener on %s: %w", cfg.TLSAddr, err)
		}
		return nil, fmt.Errorf("netio: listen on %s: %w", cfg.Addr, err)
	}
	return s, nil
}

// listenAddr makes an unspecified host ("", "0.0.0.0", "::") mean every
// address, IPv4 and IPv6, as net.Listen does: gnet binds "[::]" IPv6-only
// and "0.0.0.0" IPv4-only, but an empty host dual-stack.
func listenAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr // gnet reports it
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		return ":" + port
	}
	return addr
}

// Addr is the address the broker listens on.
func (s *Server) Addr() net.Addr { return s.addr }

// Close stops accepting, closes every connection with connection_forced
// (after flushing what they were owed), and stops the shards.
func (s *Server) Close(ctx context.Context) error {
	if !s.closing.CompareAndSwap(false, true) {
		return nil
	}
	if s.tls != nil {
		s.tls.close() // accept no more
	}
	s.connsMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connsMu.Unlock()
	if s.nodeLog != nil {
		// A cluster's replicated queues led here go to a follower first
		// (5 s at most): they fail over in a round trip.
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.Broker.TransferLeaderships(tctx); err != nil {
			s.log.Warn("shutting down before every queue's leadership was handed over", "err", err)
		}
		cancel()
	}
	// Let the shards finish what is queued so confirms go out first.
	_ = s.Barrier(ctx)
	changed := s.Changed()
	for _, c := range conns {
		c.closeWith(wire.ConnectionForced, "broker shutting down")
	}
	// Let the loops write each CLOSE and close its socket (for at most a
	// second) before the engine stops: stopping drops the writes still
	// queued, and a client would read EOF where the spec promises CLOSE
	// connection_forced.
	drain := time.NewTimer(time.Second)
	for s.ConnectionCount() > 0 {
		select {
		case <-changed:
			changed = s.Changed()
			continue
		case <-drain.C:
		case <-ctx.Done():
		}
		break
	}
	drain.Stop()
	err := s.eng.Stop(ctx)
	select {
	case <-s.stopped:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if s.tls != nil {
		s.tls.wait(ctx) // the engine closed their broker sides
	}
	s.removePrivateDir()
	if serr := s.Broker.Stop(ctx); err == nil {
		err = serr
	}
	if serr := s.Broker.CloseMetaLog(ctx); err == nil {
		err = serr
	}
	if s.nodeLog != nil {
		if serr := s.nodeLog.Close(); err == nil {
			err = serr
		}
	}
	return err
}

func (s *Server) removePrivateDir() {
	if s.privateDir != "" {
		_ = os.RemoveAll(s.privateDir)
	}
}

// ConnectionCount is the number of open connections.
func (s *Server) ConnectionCount() int {
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	return len(s.conns)
}

// gnetLogger routes gnet's own logging into slog.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug(fmt.Sprintf(f, a...)) }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug(fmt.Sprintf(f, a...)) }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn(fmt.Sprintf(f, a...)) }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...)) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...)) }

// ConnInfo describes an open connection.
type ConnInfo struct {
	ID       uint64 `json:"id"`
	Remote   string `json:"remote"`
	User     string `json:"user"`
	Channels int    `json:"channels"`
	// Blocked: the broker has stopped reading this connection because it
	// published while the memory alarm was on (see the package doc).
	Blocked bool `json:"blocked"`
	// OutboundBytes: what the broker holds for the connection that the
	// socket has not taken: its outbox and gnet's buffer (as of the last
	// write; a write in flight is not counted).
	OutboundBytes int64 `json:"outbound_bytes"`
	// AutoAcksHeld: auto-ack deliveries written but not yet settled, because
	// the connection's buffered output is over its bound (a slow or stalled
	// reader); they go back to their queues if it closes.
	AutoAcksHeld int `json:"auto_acks_held"`
	// TLS: the connection came through the TLS listener.
	TLS bool `json:"tls"`
	// Vhost: the virtual host it opened ("" before it opened one).
	Vhost string `json:"vhost,omitempty"`
}

// Connections lists the open connections.
func (s *Server) Connections() []ConnInfo {
	s.connsMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connsMu.Unlock()
	out := make([]ConnInfo, 0, len(conns))
	for _, c := range conns {
		c.mu.Lock()
		n := len(c.channels)
		ob := int64(len(c.out)) + c.gnetBuffered.Load()
		held := len(c.heldAcks)
		vhost := c.vhost
		c.mu.Unlock()
		info := ConnInfo{ID: c.id, Channels: n, Blocked: c.blocked.Load(), OutboundBytes: ob, AutoAcksHeld: held, TLS: c.tls != nil, Vhost: vhost}
		if remote := c.remoteAddr(); remote.IsValid() {
			info.Remote = remote.String()
		}
		if c.state.Load() == stOpen {
			info.User = c.user
		}
		out = append(out, info)
	}
	return out
}

// CloseConnection closes a connection with connection_forced, as an
// operator would. It reports whether the connection existed.
func (s *Server) CloseConnection(id uint64, reason string) bool {
	s.connsMu.Lock()
	c := s.conns[id]
	s.connsMu.Unlock()
	if c == nil {
		return false
	}
	c.closeWith(wire.ConnectionForced, reason)
	return true
}
