package cluster

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// DefaultPort is the cluster port (native 5680, TLS 5681, HTTP 15680).
const DefaultPort = 5682

// ParsePeers parses --peers: ID=HOST[:PORT] entries separated by commas,
// every node of the cluster (this one included), ids from 1, each id and
// address once; a missing port is DefaultPort.
func ParsePeers(s string) (map[uint64]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--peers is empty: give every node as ID=HOST:PORT, separated by commas (e.g. 1=10.0.0.1:%d,2=10.0.0.2:%d,3=10.0.0.3:%d)", DefaultPort, DefaultPort, DefaultPort)
	}
	peers := map[uint64]string{}
	seen := map[string]uint64{}
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		id, addr, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("--peers: %q is not ID=HOST:PORT", e)
		}
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("--peers: %q: the node id must be a number from 1", e)
		}
		if _, dup := peers[n]; dup {
			return nil, fmt.Errorf("--peers: node %d is named twice", n)
		}
		if addr == "" {
			return nil, fmt.Errorf("--peers: node %d has no address (ID=HOST:PORT)", n)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			if !strings.Contains(err.Error(), "missing port") {
				return nil, fmt.Errorf("--peers: node %d: %q: %v", n, addr, err)
			}
			host, port = strings.Trim(addr, "[]"), strconv.Itoa(DefaultPort)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return nil, fmt.Errorf("--peers: node %d: %q: the port must be a number from 1 to 65535", n, addr)
		}
		if host == "" {
			return nil, fmt.Errorf("--peers: node %d: %q has no host", n, addr)
		}
		a := net.JoinHostPort(host, port)
		if o, dup := seen[a]; dup {
			return nil, fmt.Errorf("--peers: nodes %d and %d have the same address %s", o, n, a)
		}
		seen[a] = n
		peers[n] = a
	}
	return peers, nil
}
