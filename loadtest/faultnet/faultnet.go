// Package faultnet is a TCP fault proxy for the fault harness
// (cmd/warren-jepsen): each Proxy listens on one address and forwards
// every connection to a target, and a script can stall one or both
// directions (a partition), delay the bytes with jitter, and drop or reset
// every connection. A Net holds one Proxy per ordered pair of nodes and
// cuts by node.
//
// A partition stalls the bytes, as a real one does to TCP: nothing is
// forwarded in the cut direction while it lasts, the sender's buffers
// fill, and what was sent flows on once healed (the stream is never
// corrupted). Only a reset makes the ends see an error; a partition long
// enough for the application's heartbeats to expire is seen by them.
// Connections are accepted during a partition (a real one would stall
// their handshake instead).
package faultnet

import (
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Dir is a direction of a proxied connection.
type Dir uint8

const (
	Forward  Dir = 1 << iota // from the connecting side to the target
	Backward                 // from the target back
	Both     = Forward | Backward
)

// Proxy forwards connections from its listener to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond // blocked or delay changed
	blocked Dir
	delay   time.Duration
	jitter  time.Duration
	rng     *rand.Rand
	conns   map[net.Conn]struct{} // both ends of every live pair
	closed  bool
	wg      sync.WaitGroup
}

// Listen starts a proxy on addr ("127.0.0.1:0" for any port) to target.
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Partition stalls the bytes of d (added to what is already cut).
func (p *Proxy) Partition(d Dir) {
	p.mu.Lock()
	p.blocked |= d
	p.mu.Unlock()
}

// Heal lets every direction flow again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.blocked = 0
	p.cond.Broadcast()
	p.mu.Unlock()
}

// SetDelay delays every chunk of bytes by d plus a uniform random part of
// jitter (order is kept: a chunk never overtakes the one before it).
func (p *Proxy) SetDelay(d, jitter time.Duration) {
	p.mu.Lock()
	p.delay, p.jitter = d, jitter
	p.mu.Unlock()
}

// Reset closes every live connection with a TCP RST on both ends.
func (p *Proxy) Reset() { p.dropAll(true) }

// Drop closes every live connection with a FIN on both ends.
func (p *Proxy) Drop() { p.dropAll(false) }

func (p *Proxy) dropAll(rst bool) {
	p.mu.Lock()
	if rst {
		// Every connection first, then the closes: a pump that sees one
		// end go closes the other end itself, and that close must be a
		// reset too (it was a FIN when it came first: the client read EOF).
		for c := range p.conns {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
		}
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.dropAll(false)
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			return
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(in, out, Forward)
		go p.pump(out, in, Backward)
	}
}

type chunk struct {
	b  []byte
	at time.Time // when it may be written
}

// pump copies src to dst in direction d: a reader queues chunks, the
// writer holds each while d is cut and until its delivery time.
func (p *Proxy) pump(src, dst net.Conn, d Dir) {
	defer p.wg.Done()
	q := make(chan chunk, 64)
	go func() {
		defer close(q)
		var last time.Time
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				p.mu.Lock()
				at := time.Now().Add(p.delay)
				if p.jitter > 0 {
					at = at.Add(time.Duration(p.rng.Int64N(int64(p.jitter))))
				}
				p.mu.Unlock()
				if at.Before(last) {
					at = last
				}
				last = at
				q <- chunk{b[:n], at}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		for range q { // let the reader finish
		}
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	for c := range q {
		if w := time.Until(c.at); w > 0 {
			time.Sleep(w)
		}
		p.mu.Lock()
		for p.blocked&d != 0 && !p.closed && p.live(src) {
			p.cond.Wait()
		}
		ok := !p.closed && p.live(src)
		p.mu.Unlock()
		if !ok {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

func (p *Proxy) live(c net.Conn) bool { _, ok := p.conns[c]; return ok }

// Net is one Proxy per ordered pair of nodes: node from reaches node to
// at Link(from, to).Addr(). A connection carries bytes both ways, so a cut
// from→to stalls Forward on from's proxy to to and Backward on to's proxy
// to from.
type Net struct {
	links map[[2]int]*Proxy
}

// NewNet starts a proxy for every ordered pair of the nodes in targets
// (node id → its cluster address).
func NewNet(targets map[int]string) (*Net, error) {
	n := &Net{links: map[[2]int]*Proxy{}}
	for from := range targets {
		for to, addr := range targets {
			if from == to {
				continue
			}
			p, err := Listen("127.0.0.1:0", addr)
			if err != nil {
				n.Close()
				return nil, err
			}
			n.links[[2]int{from, to}] = p
		}
	}
	return n, nil
}

// Link is the proxy node from dials to reach node to.
func (n *Net) Link(from, to int) *Proxy { return n.links[[2]int{from, to}] }

// Cut stalls every byte from node from to node to (one way).
func (n *Net) Cut(from, to int) {
	if p := n.Link(from, to); p != nil {
		p.Partition(Forward)
	}
	if p := n.Link(to, from); p != nil {
		p.Partition(Backward)
	}
}

// Isolate cuts node both ways from every other node.
func (n *Net) Isolate(node int) {
	for k := range n.links {
		if k[0] == node {
			n.Cut(k[0], k[1])
			n.Cut(k[1], k[0])
		}
	}
}

// Heal heals every link and clears delays.
func (n *Net) Heal() {
	for _, p := range n.links {
		p.Heal()
		p.SetDelay(0, 0)
	}
}

// Each calls fn for every link.
func (n *Net) Each(fn func(from, to int, p *Proxy)) {
	for k, p := range n.links {
		fn(k[0], k[1], p)
	}
}

// Close stops every proxy.
func (n *Net) Close() {
	for _, p := range n.links {
		_ = p.Close()
	}
}
