// Command warrend is the Warren broker.
//
//	warrend [--listen ADDR] [--http ADDR] [--data DIR] [--config FILE]
//	warrend hash-password < password
//
// Settings come from, in rising precedence: defaults, the JSON config
// file, WARREN_* environment variables, flags. SIGTERM or SIGINT shuts it
// down gracefully: stop accepting, flush confirms, close clients with
// connection_forced. SIGHUP reloads the TLS certificate, key and CA files.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/crypto/bcrypt"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/admin/console"
	"github.com/warren-mq/warren/internal/httpbound"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/adminconn"
	"github.com/warren-mq/warren/netio/amqp"
	"github.com/warren-mq/warren/replication/cluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "warrend:", err)
		os.Exit(exitCode(err))
	}
}

// usageError is a mistake on the command line (exit 2).
type usageError struct{ error }

// exitCode is the process's exit status for run's error: 0, 1, or 2 for a
// usage error.
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

const usageHead = `usage: warrend [--listen ADDR|off] [--amqp-listen ADDR] [--http ADDR|off (off needs --https)] [--data DIR] [--config FILE] [--log-level LEVEL]
               [--tls-listen ADDR] [--https ADDR] [--tls-cert FILE --tls-key FILE] [--tls-ca FILE]
               [--max-queues N] [--max-exchanges N] [--max-bindings N] [--max-exclusive-queues-per-connection N]
               [--handshake-timeout-ms MS] [--disk-free-limit SIZE] [--pprof ADDR]
               [--node-id N (--peers 1=HOST:PORT,2=HOST:PORT,... | --join HOST:PORT) [--cluster-listen ADDR] --cluster-secret-file FILE]
       warrend hash-password < password      (prints a bcrypt hash for the config file)

Settings come from, in rising precedence: defaults, the JSON config file, WARREN_* environment
variables, flags. Exit codes: 0 success, 1 failure, 2 usage error.

Flags:
`

// fileConfig is the JSON config file.
type fileConfig struct {
	Listen           string       `json:"listen"`
	AMQPListen       string       `json:"amqp_listen"` // AMQP 0-9-1 address; empty: off
	HTTP             string       `json:"http"`
	Data             string       `json:"data"`
	LogLevel         string       `json:"log_level"`
	LogFormat        string       `json:"log_format"` // text or json
	Users            []netio.User `json:"users"`
	DisableGuest     bool         `json:"disable_guest"`
	MaxConnections   int          `json:"max_connections"`
	MaxChannels      uint16       `json:"max_channels"`
	MaxFrame         uint32       `json:"max_frame"`
	HeartbeatMs      uint32       `json:"heartbeat_ms"`
	MaxPrefetch      uint32       `json:"max_prefetch"`
	MaxOutboundBytes int          `json:"max_outbound_bytes"`
	MemoryHighWater  int64        `json:"memory_high_watermark_bytes"`
	DiskFreeLimit    byteSize     `json:"disk_free_limit"` // bytes or "2GiB"; 0: 2 GiB; -1: off
	QueueSoftLimit   int64        `json:"queue_soft_limit"`
	MaxQueues        int          `json:"max_queues"`                          // 0: 1,000,000
	MaxExchanges     int          `json:"max_exchanges"`                       // 0: 100,000 (the four amq.* included)
	MaxBindings      int          `json:"max_bindings"`                        // 0: 4,000,000
	MaxExclusive     int          `json:"max_exclusive_queues_per_connection"` // 0: 10,000
	MaxConsumers     int          `json:"max_consumers_per_connection"`        // 0: 10,000
	// The HTTP listeners (console, admin API, /metrics, probes), both
	// together: internal/httpbound.
	MaxHTTPConnections int   `json:"max_http_connections"` // 0: 1,000
	HTTPTimeoutMs      int64 `json:"http_timeout_ms"`      // a request's body, a response, idle between requests; 0: 60,000

	HandshakeTimeoutMs      int64    `json:"handshake_timeout_ms"`            // accept to OPEN_OK; 10000
	MaxUnauthenticated      int      `json:"max_unauthenticated_connections"` // 1000
	MaxConnectionsPerSource int      `json:"max_connections_per_source"`      // 0: no cap
	ProxyProtocolTrusted    []string `json:"proxy_protocol_trusted"`          // CIDRs or addresses; empty: PROXY off

	// TLS (tlsSettings): the native protocol's TLS listener and the HTTPS
	// port, off unless set; the files are PEM, reloaded on SIGHUP.
	TLSListen string `json:"tls_listen"`
	HTTPS     string `json:"https"`
	TLSCert   string `json:"tls_cert"`
	TLSKey    string `json:"tls_key"`
	TLSCA     string `json:"tls_ca"` // client certificates: optional, verified against it when given
}

// checkUsers refuses config-file users that could never log in (a
// password_hash that is not a bcrypt hash, such as the README's "$2a$10$..."
// placeholder) or that the file cannot mean (no name, a name twice): the
// broker would otherwise create them at the first start and keep them in
// its metadata, and with disable_guest nobody could log in.
func checkUsers(users []netio.User) error {
	seen := make(map[string]bool, len(users))
	for i, u := range users {
		if u.Name == "" {
			return fmt.Errorf("users[%d]: a user without a name (each needs a name and a password_hash made with warrend hash-password)", i)
		}
		if seen[u.Name] {
			return fmt.Errorf("user %q is listed twice (give each user once, with its password_hash from warrend hash-password)", u.Name)
		}
		seen[u.Name] = true
		if _, err := bcrypt.Cost([]byte(u.PasswordHash)); err != nil {
			return fmt.Errorf("user %q: password_hash is not a bcrypt hash (%v); make one with: warrend hash-password < password-file", u.Name, err)
		}
	}
	return nil
}

// ready is told the bound addresses once serving (for tests): the plain
// native listener's (the TLS one's with --listen off) and the HTTP
// port's (the HTTPS one's with --http off).
type ready func(broker, http net.Addr)

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer, onReady ready) error {
	if len(args) > 0 && args[0] == "hash-password" {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		h, err := netio.HashPassword(strings.TrimRight(line, "\r\n"))
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, h)
		return nil
	}
	fc := fileConfig{Listen: "127.0.0.1:5680", HTTP: "127.0.0.1:15680", Data: "./warren-data", LogLevel: "info", LogFormat: "text"}
	fs := flag.NewFlagSet("warrend", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", "", "native protocol address (default 127.0.0.1:5680; env WARREN_LISTEN)")
	amqpListen := fs.String("amqp-listen", "", "AMQP 0-9-1 address, e.g. 127.0.0.1:5672 (default off; env WARREN_AMQP_LISTEN)")
	httpAddr := fs.String("http", "", "HTTP address for the web console (/), the admin API (/api/), /metrics, /healthz and /readyz (default 127.0.0.1:15680; env WARREN_HTTP); off serves them only over --https, which it then needs")
	data := fs.String("data", "", "data directory (default ./warren-data; env WARREN_DATA); one warrend at a time: a second one on it is refused")
	cfgPath := fs.String("config", "", "JSON config file (env WARREN_CONFIG)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error (env WARREN_LOG_LEVEL)")
	hsTimeout := fs.String("handshake-timeout-ms", "", "close connections not authenticated this long after connecting (default 10000; env WARREN_HANDSHAKE_TIMEOUT_MS)")
	maxQueues := fs.String("max-queues", "", "queues the broker holds at most (default 1000000; env WARREN_MAX_QUEUES)")
	maxExchanges := fs.String("max-exchanges", "", "exchanges the broker holds at most, the four amq.* included (default 100000; env WARREN_MAX_EXCHANGES)")
	maxBindings := fs.String("max-bindings", "", "bindings the broker holds at most (default 4000000; env WARREN_MAX_BINDINGS)")
	maxExclusive := fs.String("max-exclusive-queues-per-connection", "", "exclusive queues one connection may own (default 10000; env WARREN_MAX_EXCLUSIVE_QUEUES_PER_CONNECTION)")
	tlsListen := fs.String("tls-listen", "", "native protocol over TLS, e.g. 127.0.0.1:5681 (default off; env WARREN_TLS_LISTEN); --listen off leaves only it")
	httpsAddr := fs.String("https", "", "HTTPS address for the console, API and metrics, e.g. 127.0.0.1:15681 (default off; env WARREN_HTTPS); --http off leaves only it")
	tlsCert := fs.String("tls-cert", "", "PEM certificate (chain) for --tls-listen and --https, reloaded on SIGHUP (env WARREN_TLS_CERT)")
	tlsKey := fs.String("tls-key", "", "PEM private key of --tls-cert (env WARREN_TLS_KEY)")
	tlsCA := fs.String("tls-ca", "", "PEM CA certificates: clients may present a certificate it signed (mutual TLS, EXTERNAL) (env WARREN_TLS_CA)")
	diskLimit := fs.String("disk-free-limit", "", "block publishers while the data directory's filesystem has less free space than this, e.g. 2GiB, 500MB, or -1 for off (default 2GiB; env WARREN_DISK_FREE_LIMIT)")
	nodeID := fs.String("node-id", "", "this node's id in the cluster, a number from 1 to 65535 (env WARREN_NODE_ID); with --peers")
	clusterListen := fs.String("cluster-listen", "", fmt.Sprintf("the cluster port, HOST:PORT (default: this node's address in --peers; port %d; env WARREN_CLUSTER_LISTEN)", cluster.DefaultPort))
	peers := fs.String("peers", "", "every node of the cluster, this one included: 1=HOST:PORT,2=HOST:PORT,... (env WARREN_PEERS); the topology is replicated to every node, each durable queue to its replicas (README: Cluster quick start)")
	pprofAddr := fs.String("pprof", "", "serve Go's profiler (/debug/pprof/: CPU and heap profiles, execution traces) on this address, e.g. 127.0.0.1:6060; no authentication, so keep it on loopback (default off; env WARREN_PPROF)")
	join := fs.String("join", "", "add this new node to a running cluster through a member's cluster address, HOST:PORT (env WARREN_JOIN); with --node-id (an id no node has had) and --cluster-listen (the address the others reach this node at); ignored once the data directory holds the cluster")
	secretFile := fs.String("cluster-secret-file", "", "a file holding the shared cluster secret, at least 16 bytes (env WARREN_CLUSTER_SECRET_FILE; or the secret itself in WARREN_CLUSTER_SECRET)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usageHead)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		fmt.Fprint(stderr, usageHead)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		return usageError{err}
	}
	if fs.NArg() > 0 {
		fmt.Fprint(stderr, usageHead)
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	pick := func(flagVal, env string, dst *string) {
		if v := getenv(env); v != "" {
			*dst = v
		}
		if flagVal != "" {
			*dst = flagVal
		}
	}
	path := ""
	pick(*cfgPath, "WARREN_CONFIG", &path)
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&fc); err != nil {
			return configErr(path, b, dec.InputOffset(), err)
		}
	}
	if err := checkUsers(fc.Users); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	pick(*listen, "WARREN_LISTEN", &fc.Listen)
	pick(*amqpListen, "WARREN_AMQP_LISTEN", &fc.AMQPListen)
	pick(*httpAddr, "WARREN_HTTP", &fc.HTTP)
	pick(*data, "WARREN_DATA", &fc.Data)
	pick(*logLevel, "WARREN_LOG_LEVEL", &fc.LogLevel)
	pick(*tlsListen, "WARREN_TLS_LISTEN", &fc.TLSListen)
	pick(*httpsAddr, "WARREN_HTTPS", &fc.HTTPS)
	pick(*tlsCert, "WARREN_TLS_CERT", &fc.TLSCert)
	pick(*tlsKey, "WARREN_TLS_KEY", &fc.TLSKey)
	pick(*tlsCA, "WARREN_TLS_CA", &fc.TLSCA)
	hsMs := ""
	pick(*hsTimeout, "WARREN_HANDSHAKE_TIMEOUT_MS", &hsMs)
	if hsMs != "" {
		n, err := strconv.ParseInt(hsMs, 10, 64)
		if err != nil {
			return fmt.Errorf("handshake timeout %q: want a number of milliseconds", hsMs)
		}
		fc.HandshakeTimeoutMs = n
	}
	for _, l := range []struct {
		flag, env, key string
		dst            *int
	}{{*maxQueues, "WARREN_MAX_QUEUES", "max_queues", &fc.MaxQueues}, {*maxExchanges, "WARREN_MAX_EXCHANGES", "max_exchanges", &fc.MaxExchanges},
		{*maxBindings, "WARREN_MAX_BINDINGS", "max_bindings", &fc.MaxBindings},
		{*maxExclusive, "WARREN_MAX_EXCLUSIVE_QUEUES_PER_CONNECTION", "max_exclusive_queues_per_connection", &fc.MaxExclusive}} {
		v := ""
		pick(l.flag, l.env, &v)
		if v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%s %q: want a number", l.key, v)
			}
			*l.dst = n
		}
		if *l.dst < 0 {
			return fmt.Errorf("%s %d: want a positive number (0: the default)", l.key, *l.dst)
		}
	}
	if fc.MaxConsumers < 0 {
		return fmt.Errorf("max_consumers_per_connection %d: want a positive number (0: the default)", fc.MaxConsumers)
	}
	if fc.MaxHTTPConnections < 0 || fc.HTTPTimeoutMs < 0 {
		return fmt.Errorf("max_http_connections %d, http_timeout_ms %d: want positive numbers (0: the default)", fc.MaxHTTPConnections, fc.HTTPTimeoutMs)
	}
	dl := ""
	pick(*diskLimit, "WARREN_DISK_FREE_LIMIT", &dl)
	if dl == "-1" {
		fc.DiskFreeLimit = -1
	} else if dl != "" {
		n, err := parseSize(dl)
		if err != nil {
			return fmt.Errorf("disk-free-limit %w", err)
		}
		fc.DiskFreeLimit = byteSize(n)
	}
	if fc.DiskFreeLimit < -1 {
		return fmt.Errorf("disk_free_limit %d: want a size in bytes (0: the default, 2GiB; -1: off)", fc.DiskFreeLimit)
	}
	if fc.HandshakeTimeoutMs < 0 {
		return fmt.Errorf("handshake timeout %dms: want a positive number of milliseconds (0: the default, 10000)", fc.HandshakeTimeoutMs)
	}
	var nid, cl, pe, jo, sf string
	pick(*nodeID, "WARREN_NODE_ID", &nid)
	pick(*clusterListen, "WARREN_CLUSTER_LISTEN", &cl)
	pick(*peers, "WARREN_PEERS", &pe)
	pick(*secretFile, "WARREN_CLUSTER_SECRET_FILE", &sf)
	pick(*join, "WARREN_JOIN", &jo)
	cc, err := clusterSettings(nid, cl, pe, jo, sf, getenv)
	if err != nil {
		return err
	}
	if cc != nil && cc.Join == "" && len(cc.Peers) == 1 && cc.NodeID != 1 {
		return fmt.Errorf("--peers names only node %d: a single node is node 1 (list every node of a cluster, this one included)", cc.NodeID)
	}
	if cc != nil && cc.Join == "" && len(cc.Peers) == 1 {
		cc = nil // a cluster of one: the single node
	}
	tlsFiles, err := tlsSettings(&fc)
	if err != nil {
		return err
	}
	proxyTrusted, err := parsePrefixes(fc.ProxyProtocolTrusted)
	if err != nil {
		return fmt.Errorf("proxy_protocol_trusted: %w", err)
	}
	if v := getenv("WARREN_MEMORY_HIGH_WATERMARK_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("WARREN_MEMORY_HIGH_WATERMARK_BYTES: %w", err)
		}
		fc.MemoryHighWater = n
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(fc.LogLevel)); err != nil {
		return fmt.Errorf("log level %q: want debug, info, warn or error", fc.LogLevel)
	}
	var h slog.Handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	if fc.LogFormat == "json" {
		h = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})
	}
	log := slog.New(h)

	if err := os.MkdirAll(fc.Data, 0o750); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	dataLock, unlocked, err := lockDataDir(fc.Data)
	if err != nil {
		return err
	}
	if dataLock != nil {
		defer dataLock.Close()
	}
	if unlocked != nil {
		log.Warn("the data directory could not be locked: nothing keeps a second warrend off it", "data", fc.Data, "err", unlocked)
	}
	if fc.MemoryHighWater == 0 {
		fc.MemoryHighWater = netio.DefaultMemoryHighWater() // 40% of the cgroup's limit or the host's RAM
	}
	if getenv("GOMEMLIMIT") == "" {
		// The alarm keeps the live heap near the watermark; this keeps the
		// garbage from doubling it (GOGC's default lets the heap grow to
		// twice the live data before collecting).
		lim := goMemoryLimit(fc.MemoryHighWater)
		debug.SetMemoryLimit(lim)
		log.Info("memory", "high_watermark_bytes", fc.MemoryHighWater, "go_memory_limit_bytes", lim)
	}
	// The HTTP port opens first, so /healthz and /readyz answer during
	// recovery (/readyz: 503 until the listener is open).
	var ln, lnTLS net.Listener
	if fc.HTTP != "off" {
		if ln, err = net.Listen("tcp", fc.HTTP); err != nil {
			return fmt.Errorf("http: %w", err)
		}
	}
	if fc.HTTPS != "" {
		if lnTLS, err = net.Listen("tcp", fc.HTTPS); err != nil {
			if ln != nil {
				_ = ln.Close()
			}
			return fmt.Errorf("https: %w", err)
		}
	}
	pprofA := ""
	pick(*pprofAddr, "WARREN_PPROF", &pprofA)
	if pprofA != "" {
		pln, err := net.Listen("tcp", pprofA)
		if err != nil {
			return fmt.Errorf("pprof: %w", err)
		}
		defer servePprof(pln)()
	}
	var state atomic.Int32
	var srvp atomic.Pointer[netio.Server]
	var amqpp atomic.Pointer[amqp.Listener]
	var webH atomic.Pointer[console.Console]
	mux := http.NewServeMux()
	scrapes := newSharedScrape(func(w io.Writer) {
		if s := srvp.Load(); s != nil {
			s.WriteMetrics(w)
		}
		if a := amqpp.Load(); a != nil {
			a.WriteMetrics(w)
		}
		metrics.WriteProcessMetrics(w)
		writeDiskMetrics(w, fc.Data)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(scrapes.get())
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("/readyz", readyzHandler(&state, func() bool {
		s := srvp.Load()
		return cc == nil || (s != nil && s.Broker.MetaReady())
	}))
	web := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := webH.Load(); c != nil {
			c.ServeHTTP(w, r)
			return
		}
		http.Error(w, "recovering: the broker is not serving yet", http.StatusServiceUnavailable)
	})
	mux.Handle("/api/", web)
	mux.Handle("/", web)
	hb := httpbound.New(httpbound.Limits{MaxConns: fc.MaxHTTPConnections, Timeout: time.Duration(fc.HTTPTimeoutMs) * time.Millisecond})
	hs := hb.Server(&http.Server{Handler: mux})
	if ln != nil {
		go func() { _ = hs.Serve(hb.Listener(ln)) }()
	}
	defer hs.Close()
	hsTLS := hb.Server(&http.Server{Handler: mux})
	if lnTLS != nil {
		hsTLS.TLSConfig = tlsFiles.Config()
		go func() { _ = hsTLS.ServeTLS(hb.Listener(lnTLS), "", "") }()
	}
	defer hsTLS.Close()
	if tlsFiles != nil {
		stopHUP := reloadOnSIGHUP(tlsFiles, log)
		defer stopHUP()
	}

	fatal := make(chan error, 1)
	var cn *clusterNode
	if cc != nil {
		if why, err := os.ReadFile(filepath.Join(fc.Data, removedMarker)); err == nil {
			// The marker holds why; the usual why says nothing more.
			because := ""
			if w := strings.TrimSpace(string(why)); w != "" && w != removedWhy {
				because = " (" + w + ")"
			}
			return fmt.Errorf("node %d was removed from the cluster%s: it cannot serve again; start a new node with an empty data directory and a new --node-id (--join)", cc.NodeID, because)
		}
		cc.SpoolDir = filepath.Join(fc.Data, "spool")
		if cn, err = startCluster(cc, log); err != nil {
			return err
		}
		defer cn.close()
	}
	log.Info("recovering", "data", fc.Data)
	srv, err := netio.Start(netio.Config{
		Addr: fc.Listen, DisablePlain: fc.Listen == "off", TLSAddr: fc.TLSListen, TLSConfig: tlsConfig(tlsFiles), Users: fc.Users, DisableGuest: fc.DisableGuest, MaxConnections: fc.MaxConnections,
		MaxChannels: fc.MaxChannels, MaxFrame: fc.MaxFrame, HeartbeatMs: fc.HeartbeatMs, MaxPrefetch: fc.MaxPrefetch,
		MaxOutboundBytes: fc.MaxOutboundBytes, MemoryHighWater: fc.MemoryHighWater, QueueSoftLimit: fc.QueueSoftLimit, Logger: log,
		HandshakeTimeout: time.Duration(fc.HandshakeTimeoutMs) * time.Millisecond, MaxUnauthenticated: fc.MaxUnauthenticated,
		MaxConnectionsPerSource: fc.MaxConnectionsPerSource, ProxyTrusted: proxyTrusted,
		DataDir: fc.Data, DiskFreeLimit: int64(fc.DiskFreeLimit),
		Fatal: func(err error) {
			select {
			case fatal <- err:
			default:
			}
		},
		MaxQueues: fc.MaxQueues, MaxExchanges: fc.MaxExchanges, MaxBindings: fc.MaxBindings, MaxExclusivePerConnection: fc.MaxExclusive, MaxConsumersPerConnection: fc.MaxConsumers,
		NodeID: cn.id(), MetaPeers: cn.ids(), RaftSend: cn.send(), RaftSendSnapshot: cn.sendSnapshot(), RaftForward: cn.forward(), OnBroker: cn.setBroker, ClusterCtx: ctx,
		Membership: cn.membership(),
	})
	if err != nil {
		return err
	}
	srvp.Store(srv)
	var al *amqp.Listener
	if fc.AMQPListen != "" {
		al, err = amqp.Listen(srv, amqp.Config{Addr: fc.AMQPListen, Logger: log,
			// The native listener's connection bounds, counted separately.
			MaxConnections: fc.MaxConnections, HandshakeTimeout: time.Duration(fc.HandshakeTimeoutMs) * time.Millisecond,
			MaxUnauthenticated: fc.MaxUnauthenticated, MaxConnectionsPerSource: fc.MaxConnectionsPerSource,
			ProxyTrusted: proxyTrusted})
		if err != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_ = srv.Close(sctx)
			return fmt.Errorf("amqp-listen %s: %w", fc.AMQPListen, err)
		}
		amqpp.Store(al)
	}
	api := admin.New(srv.Broker, adminconn.New(srv), log, 0)
	defer api.Close()
	if cn != nil {
		api.SetClusterNodes(cn.nodes)
	}
	api.SetDataDir(fc.Data)
	// The web console at /, and the admin API for its sessions and for
	// HTTP Basic credentials (503 until recovery is done).
	webH.Store(console.New(api, adminconn.New(srv)))
	state.Store(stateReady)
	log.Info("durable exchanges, queues, bindings between durable ends, and the messages of durable queues survive a restart (README: Durability)")
	brokerAddr, readyHTTP := srv.Addr(), net.Addr(nil)
	if brokerAddr == nil {
		brokerAddr = srv.TLSAddr()
	}
	if ln != nil {
		readyHTTP = ln.Addr()
	} else if lnTLS != nil {
		readyHTTP = lnTLS.Addr()
	}
	log.Info("warrend started", "listen", addrString(srv.Addr()), "tls_listen", addrString(srv.TLSAddr()),
		"http", addrString(ln), "https", addrString(lnTLS), "data", fc.Data, "version", netio.Version)
	if onReady != nil {
		onReady(brokerAddr, readyHTTP)
	}
	var failed, removed error
	var removedCh chan string
	if cn != nil {
		removedCh = cn.removed
	}
	select {
	case <-ctx.Done():
	case failed = <-fatal:
		log.Error("the log on disk could not be written; stopping (restart to recover from the log)", "err", failed)
	case why := <-removedCh:
		removed = fmt.Errorf("node %d: %s; it stops and will not serve again (its data directory can be deleted)", cn.id(), why)
		log.Error("removed from the cluster: stopping", "node", cn.id())
		_ = os.WriteFile(filepath.Join(fc.Data, removedMarker), []byte(why+"\n"), 0o640)
	}
	state.Store(stateStopping)
	log.Info("shutting down")
	if cn != nil && failed == nil && removed == nil {
		// Graceful shutdown (design §6.6): the metadata leadership goes to
		// the most caught-up voter, and the queues led here to theirs, in
		// parallel, 5 s at most (srv.Close hands on any queue left).
		hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
		queues := make(chan error, 1)
		go func() { queues <- srv.Broker.TransferLeaderships(hctx) }()
		if to, err := srv.Broker.HandOffMetaLeadership(hctx); err != nil {
			log.Warn("the metadata group's leadership was not handed on before stopping (the others elect a leader in 1-2 s)", "err", err)
		} else if to != 0 {
			log.Info("handed the metadata group's leadership on", "to", to)
		}
		<-queues
		hcancel()
	}
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if al != nil {
		_ = al.Close() // its connections' Downs reach the broker before it stops
	}
	err = srv.Close(sctx)
	_ = hs.Shutdown(sctx)
	_ = hsTLS.Shutdown(sctx)
	log.Info("stopped")
	if failed != nil {
		return fmt.Errorf("the log on disk could not be written (restart to recover from it): %w", failed)
	}
	if removed != nil {
		return removed
	}
	return err
}

// removedMarker, in the data directory, records that the node was
// removed from the cluster: it refuses to start again.
const removedMarker = "cluster-removed"

// removedWhy is what the marker says when the metadata removed the node.
const removedWhy = "this node was removed from the cluster"

// What /readyz reports (readyzHandler).
const (
	stateRecovering = iota // recovering the topology from the log: the listener is not open
	stateReady             // serving
	stateStopping          // shutting down
)

// readyzHandler answers /readyz: 503 while recovering or stopping, or
// while the cluster's metadata group has no leader or this node has not
// applied what it committed (metaReady false), 200 while serving.
func readyzHandler(state *atomic.Int32, metaReady func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch state.Load() {
		case stateRecovering:
			http.Error(w, "recovering: the broker is not serving yet", http.StatusServiceUnavailable)
		case stateStopping:
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case stateReady:
			if metaReady != nil && !metaReady() {
				http.Error(w, "the cluster's metadata group has no leader, or this node is catching up", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ready\n")
		default:
			io.WriteString(w, "ready\n")
		}
	})
}

// configErr says where in the config file a decode error is, as
// FILE:LINE:COLUMN, and what was wrong there.
func configErr(path string, b []byte, off int64, err error) error {
	msg := strings.TrimPrefix(err.Error(), "json: ")
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
		msg = fmt.Sprintf("%s wants %s, not a JSON %s", te.Field, te.Type, te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		off, msg = int64(len(b)), "the file ends before the JSON object does"
	case strings.HasPrefix(msg, "unknown field "):
		// The decoder reports the end of the object: find the key.
		if name, uerr := strconv.Unquote(strings.TrimPrefix(msg, "unknown field ")); uerr == nil {
			if i := bytes.Index(b, []byte(strconv.Quote(name))); i >= 0 {
				off = int64(i) + 1
			}
		}
		msg += " (see the README for the settings a config file takes)"
	}
	line, col := 1, 1
	for _, c := range b[:max(0, min(off, int64(len(b)))-1)] {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Errorf("config %s:%d:%d: %s", path, line, col, msg)
}

// goMemoryLimit is the soft memory limit warrend gives the Go runtime for a
// watermark: what the runtime holds at start, the watermark, and an eighth
// of it (at least 32 MiB, the broker's own working memory) for the rest.
func goMemoryLimit(watermark int64) int64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	rtmetrics.Read(s)
	base := int64(0)
	if s[0].Value.Kind() == rtmetrics.KindUint64 && s[1].Value.Kind() == rtmetrics.KindUint64 {
		base = int64(s[0].Value.Uint64() - s[1].Value.Uint64())
	}
	return base + watermark + max(watermark/8, 32<<20)
}
