package main

import (
	"bytes"
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
	"github.com/warren-mq/warren/replication/cluster"
	"go.etcd.io/raft/v3/raftpb"
)

// clusterConfig is what the cluster flags say (nil: a single node).
type clusterConfig struct {
	NodeID uint64
	Listen string            // the cluster port's listen address
	Peers  map[uint64]string // every node, this one included
	Secret []byte
}

// clusterSettings validates --node-id, --cluster-listen, --peers and the
// cluster secret (--cluster-secret-file, else WARREN_CLUSTER_SECRET).
// Flags already merged with their environment variables.
func clusterSettings(nodeID, listen, peers, secretFile string, getenv func(string) string) (*clusterConfig, error) {
	if nodeID == "" && listen == "" && peers == "" {
		return nil, nil
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
	if secretFile != "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return nil, fmt.Errorf("cluster secret file: %w", err)
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			return nil, fmt.Errorf("cluster secret file %s is empty: put a secret of at least %d bytes in it, the same on every node", secretFile, cluster.MinSecretLen)
		}
		cc.Secret = b
	} else if s := getenv("WARREN_CLUSTER_SECRET"); s != "" {
		cc.Secret = []byte(s)
	}
	if len(p) > 1 {
		if len(cc.Secret) == 0 {
			return nil, fmt.Errorf("a multi-node cluster needs a shared secret: put one (at least %d bytes) in a file named by --cluster-secret-file (env WARREN_CLUSTER_SECRET_FILE), or in WARREN_CLUSTER_SECRET, the same on every node", cluster.MinSecretLen)
		}
		if len(cc.Secret) < cluster.MinSecretLen {
			return nil, fmt.Errorf("the cluster secret has %d bytes; it needs at least %d bytes", len(cc.Secret), cluster.MinSecretLen)
		}
	}
	return cc, nil
}

// clusterNode is this node's part in a multi-node cluster: the transport
// to its peers, which hands what they send to the broker once it exists.
type clusterNode struct {
	cc *clusterConfig
	tr *cluster.Transport
	b  atomic.Pointer[broker.Broker]
}

// startCluster opens the cluster port and starts dialling the peers
// (the secret was checked by clusterSettings).
func startCluster(cc *clusterConfig, log *slog.Logger) (*clusterNode, error) {
	cn := &clusterNode{cc: cc}
	tr, err := cluster.New(cluster.Config{NodeID: cc.NodeID, Listen: cc.Listen, Peers: cc.Peers, Secret: cc.Secret, Logger: log,
		Deliver: func(gid uint64, m raftpb.Message) {
			if b := cn.b.Load(); b != nil {
				b.StepRaft(gid, m)
			}
		},
		DeliverSnapshot: func(gid uint64, s *cluster.Snapshot) {
			if b := cn.b.Load(); b != nil {
				b.StepSnapshot(gid, (*broker.SnapshotMessage)(s))
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

// nodes is what GET /api/cluster lists.
func (cn *clusterNode) nodes() []admin.ClusterNode {
	out := make([]admin.ClusterNode, 0, len(cn.cc.Peers))
	for id, addr := range cn.cc.Peers {
		self := id == cn.cc.NodeID
		out = append(out, admin.ClusterNode{ID: id, ClusterAddr: addr, Self: self, Connected: self || cn.tr.PeerStats(id).Connected})
	}
	return out
}
