package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/replication/cluster"
	"go.etcd.io/raft/v3/raftpb"
)

// clusterConfig is what the cluster flags say (nil: a single node).
type clusterConfig struct {
	NodeID uint64
	Listen string            // the cluster port's listen address
	Peers  map[uint64]string // every node, this one included (a joining node: itself)
	Secret []byte
	// Join: a member's cluster address (--join): this node asks it to be
	// added to the cluster, unless its data already holds the cluster.
	Join string
	// SpoolDir: where snapshots from a leader are spooled as they arrive
	// (under the data directory).
	SpoolDir string
}

// clusterSettings validates --node-id, --cluster-listen, --peers and the
// cluster secret (--cluster-secret-file, else WARREN_CLUSTER_SECRET).
// Flags already merged with their environment variables.
func clusterSettings(nodeID, listen, peers, join, secretFile string, getenv func(string) string) (*clusterConfig, error) {
	if nodeID == "" && listen == "" && peers == "" && join == "" {
		return nil, nil
	}
	if join != "" {
		return joinSettings(nodeID, listen, peers, join, secretFile, getenv)
	}
	if peers == "" {
		if nodeID != "" {
			return nil, errors.New("--node-id needs --peers listing every node of the cluster (ID=HOST:PORT,...), this one included")
		}
		return nil, errors.New("--cluster-listen needs --peers and --node-id")
	}
	if nodeID == "" {
		return nil, errors.New("--peers needs --node-id: this node's id among them")
	}
	id, err := strconv.ParseUint(nodeID, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("--node-id %q: want a number from 1", nodeID)
	}
	if id == 0 {
		return nil, errors.New("--node-id 0: node ids are numbers from 1")
	}
	p, err := cluster.ParsePeers(peers)
	if err != nil {
		return nil, err
	}
	if _, ok := p[id]; !ok {
		return nil, fmt.Errorf("--node-id %d is not in --peers: list every node, this one included", id)
	}
	cc := &clusterConfig{NodeID: id, Peers: p, Listen: p[id]}
	if listen != "" {
		host, port, err := net.SplitHostPort(listen)
		if err != nil {
			if !strings.Contains(err.Error(), "missing port") {
				return nil, fmt.Errorf("--cluster-listen %q: want HOST:PORT (default port %d)", listen, cluster.DefaultPort)
			}
			host, port = strings.Trim(listen, "[]"), strconv.Itoa(cluster.DefaultPort)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("--cluster-listen %q: the port must be a number from 1 to 65535", listen)
		}
		cc.Listen = net.JoinHostPort(host, port)
	}
	return cc, clusterSecret(cc, secretFile, getenv)
}

// joinSettings: --join HOST:PORT with --node-id and --cluster-listen (the
// address the other nodes reach this one at).
func joinSettings(nodeID, listen, peers, join, secretFile string, getenv func(string) string) (*clusterConfig, error) {
	if peers != "" {
		return nil, errors.New("give --peers (the cluster's first nodes) or --join (a node added later), not both")
	}
	if nodeID == "" {
		return nil, errors.New("--join needs --node-id: this node's id, a number from 1 that no node of the cluster has or had")
	}
	id, err := strconv.ParseUint(nodeID, 10, 64)
	if err != nil || id == 0 {
		return nil, fmt.Errorf("--node-id %q: want a number from 1", nodeID)
	}
	if _, _, err := net.SplitHostPort(join); err != nil {
		return nil, fmt.Errorf("--join %q: want a member's cluster address, HOST:PORT", join)
	}
	host, port, err := net.SplitHostPort(listen)
	if listen == "" || err != nil {
		return nil, errors.New("--join needs --cluster-listen HOST:PORT: the address the other nodes reach this node at")
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("--cluster-listen %q: with --join, give a host the other nodes can reach (not a wildcard): it is this node's address in the cluster", listen)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return nil, fmt.Errorf("--cluster-listen %q: the port must be a number from 1 to 65535", listen)
	}
	cc := &clusterConfig{NodeID: id, Listen: listen, Peers: map[uint64]string{id: listen}, Join: join}
	if err := clusterSecret(cc, secretFile, getenv); err != nil {
		return nil, err
	}
	return cc, nil
}

// clusterSecret reads the cluster secret into cc and checks it.
func clusterSecret(cc *clusterConfig, secretFile string, getenv func(string) string) error {
	p := cc.Peers
	if secretFile != "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return fmt.Errorf("cluster secret file: %w", err)
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			return fmt.Errorf("cluster secret file %s is empty: put a secret of at least %d bytes in it, the same on every node", secretFile, cluster.MinSecretLen)
		}
		cc.Secret = b
	} else if s := getenv("WARREN_CLUSTER_SECRET"); s != "" {
		cc.Secret = []byte(s)
	}
	if len(p) > 1 || cc.Join != "" {
		if len(cc.Secret) == 0 {
			return fmt.Errorf("a multi-node cluster needs a shared secret: put one (at least %d bytes) in a file named by --cluster-secret-file (env WARREN_CLUSTER_SECRET_FILE), or in WARREN_CLUSTER_SECRET, the same on every node", cluster.MinSecretLen)
		}
		if len(cc.Secret) < cluster.MinSecretLen {
			return fmt.Errorf("the cluster secret has %d bytes; it needs at least %d bytes", len(cc.Secret), cluster.MinSecretLen)
		}
	}
	return nil
}

// clusterNode is this node's part in a multi-node cluster: the transport
// to its peers, which hands what they send to the broker once it exists.
type clusterNode struct {
	cc *clusterConfig
	tr *cluster.Transport
	b  atomic.Pointer[broker.Broker]
	// removed hears why, once this node was removed from the cluster.
	removed chan string
}

// startCluster opens the cluster port and starts dialling the peers
// (the secret was checked by clusterSettings).
func startCluster(cc *clusterConfig, log *slog.Logger) (*clusterNode, error) {
	cn := &clusterNode{cc: cc, removed: make(chan string, 1)}
	tr, err := cluster.New(cluster.Config{NodeID: cc.NodeID, Listen: cc.Listen, Peers: cc.Peers, Secret: cc.Secret, Logger: log, SpoolDir: cc.SpoolDir,
		Handle: func(from uint64, op byte, body []byte) ([]byte, error) {
			if b := cn.b.Load(); b != nil {
				return b.HandleClusterCall(from, op, body)
			}
			return nil, errors.New("this node is still starting: retry")
		},
		OnRemoved: func(reason string) {
			if b := cn.b.Load(); b != nil {
				b.NoteRemoved(reason)
			}
		},
		Deliver: func(gid uint64, m raftpb.Message) {
			if b := cn.b.Load(); b != nil {
				b.StepRaft(gid, m)
			}
		},
		DeliverSnapshot: func(gid uint64, s *cluster.Snapshot) {
			if b := cn.b.Load(); b != nil {
				b.StepClusterSnapshot(gid, (*broker.SnapshotMessage)(s))
			}
		},
		DeliverForward: func(from uint64, p []byte) {
			if b := cn.b.Load(); b != nil {
				b.StepForward(from, p)
			}
		}})
	if err != nil {
		return nil, err
	}
	cn.tr = tr
	log.Info("cluster transport listening", "node", cc.NodeID, "cluster_listen", tr.Addr().String(), "nodes", len(cc.Peers))
	return cn, nil
}

func (cn *clusterNode) close() { _ = cn.tr.Close() }

func (cn *clusterNode) id() uint64 {
	if cn == nil {
		return 0
	}
	return cn.cc.NodeID
}

// ids is every node's id, sorted.
func (cn *clusterNode) ids() []uint64 {
	if cn == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(cn.cc.Peers))
}

func (cn *clusterNode) send() func(gid uint64, msgs []raftpb.Message) {
	if cn == nil {
		return nil
	}
	return cn.tr.Send
}

func (cn *clusterNode) sendSnapshot() func(gid uint64, s *broker.SnapshotMessage, done func(bool)) {
	if cn == nil {
		return nil
	}
	return func(gid uint64, s *broker.SnapshotMessage, done func(bool)) {
		cn.tr.SendSnapshot(gid, (*cluster.Snapshot)(s), done)
	}
}

func (cn *clusterNode) forward() func(to uint64, p []byte) bool {
	if cn == nil {
		return nil
	}
	return cn.tr.SendForward
}

func (cn *clusterNode) setBroker(b *broker.Broker) {
	if cn != nil {
		cn.b.Store(b)
	}
}

// nodes is what GET /api/cluster lists: the members as the metadata
// group has them (before it is open, --peers).
func (cn *clusterNode) nodes() []admin.ClusterNode {
	if b := cn.b.Load(); b != nil {
		if ms, _, ok := b.ClusterMembers(); ok && len(ms) > 0 {
			out := make([]admin.ClusterNode, 0, len(ms))
			for _, m := range ms {
				self := m.ID == cn.cc.NodeID
				out = append(out, admin.ClusterNode{ID: m.ID, ClusterAddr: m.Address, Role: m.Role, Self: self,
					Connected: self || cn.tr.PeerStats(m.ID).Connected})
			}
			return out
		}
	}
	out := make([]admin.ClusterNode, 0, len(cn.cc.Peers))
	for id, addr := range cn.cc.Peers {
		self := id == cn.cc.NodeID
		out = append(out, admin.ClusterNode{ID: id, ClusterAddr: addr, Self: self, Connected: self || cn.tr.PeerStats(id).Connected})
	}
	return out
}

// membership is the metadata group's membership hooks: the transport
// follows the members, forwards requests to the leader and streams the
// metadata snapshot; with --join, the join call.
func (cn *clusterNode) membership() broker.Membership {
	if cn == nil {
		return broker.Membership{}
	}
	m := broker.Membership{
		Addrs:     cn.cc.Peers,
		OnMembers: func(members map[uint64]string, removed []uint64) { cn.tr.SetPeers(members, removed) },
		OnRemoved: func() {
			select {
			case cn.removed <- removedWhy:
			default:
			}
		},
		Forward: cn.tr.CallNode,
		SendSnapshot: func(gid uint64, s *replication.SnapshotMessage, done func(bool)) {
			cn.tr.SendSnapshot(gid, (*cluster.Snapshot)(s), done)
		},
	}
	if cn.cc.Join != "" {
		m.Join = func(ctx context.Context) (map[uint64]string, error) {
			body, _ := json.Marshal(broker.MemberRequest{NodeID: cn.cc.NodeID, Address: cn.cc.Listen, Joining: true})
			_, ans, err := cn.tr.Call(ctx, cn.cc.Join, broker.CallJoin, body)
			if err != nil {
				return nil, fmt.Errorf("asking %s to add node %d at %s: %w", cn.cc.Join, cn.cc.NodeID, cn.cc.Listen, err)
			}
			var ja broker.JoinAnswer
			if err := json.Unmarshal(ans, &ja); err != nil {
				return nil, err
			}
			cn.tr.SetPeers(ja.Members, nil)
			return ja.Members, nil
		}
	}
	return m
}
