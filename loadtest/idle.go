package loadtest

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"github.com/warren-mq/warren/client"
)

// IdleOptions describes a set of idle connections: authenticated, each with
// its channels open, sending nothing but heartbeats.
type IdleOptions struct {
	URL       string
	Conns     int
	Channels  int           // channels opened on each connection; 0: none
	Heartbeat time.Duration // proposed to the broker; 0: the client's default (10 s)
	// Parallel bounds the handshakes in flight: keep it under the broker's
	// max_unauthenticated_connections (1,000 by default), or the broker
	// refuses the excess. 0: 64.
	Parallel int
	TLS      *tls.Config
}

// IdleSet is a set of open idle connections (OpenIdle).
type IdleSet struct {
	conns []*client.Conn
}

// OpenIdle opens o.Conns connections, o.Parallel at a time, and returns
// once every one is authenticated with its channels open. On an error the
// ones already open are closed.
func OpenIdle(ctx context.Context, o IdleOptions) (*IdleSet, error) {
	if o.Parallel <= 0 {
		o.Parallel = 64
	}
	s := &IdleSet{conns: make([]*client.Conn, o.Conns)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	next := make(chan int)
	for w := 0; w < min(o.Parallel, o.Conns); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := openIdleConn(ctx, o)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("loadtest: idle connection %d of %d: %w", i+1, o.Conns, err)
					}
					mu.Unlock()
					cancel()
					continue
				}
				s.conns[i] = c
			}
		}()
	}
feed:
	for i := 0; i < o.Conns; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		s.Close()
		return nil, firstErr
	}
	return s, nil
}

func openIdleConn(ctx context.Context, o IdleOptions) (*client.Conn, error) {
	c, err := client.Dial(ctx, o.URL, client.Options{Heartbeat: o.Heartbeat, Name: "warren-loadtest idle", TLS: o.TLS})
	if err != nil {
		return nil, err
	}
	for j := 0; j < o.Channels; j++ {
		if _, err := c.Channel(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Lost counts the connections that have closed since they opened (a
// heartbeat timeout, or the broker closing them): an idle connection
// should never close.
func (s *IdleSet) Lost() (n int, first error) {
	for _, c := range s.conns {
		if c == nil {
			continue
		}
		select {
		case <-c.Done():
			if n++; first == nil {
				first = c.Err()
			}
		default:
		}
	}
	return n, first
}

// Len is the number of connections in the set.
func (s *IdleSet) Len() int { return len(s.conns) }

// Close closes every connection.
func (s *IdleSet) Close() {
	for _, c := range s.conns {
		if c != nil {
			c.Close()
		}
	}
}
