package main

import (
	"bytes"
	"io"
	"sync"
	"time"
)

// sharedScrape serves /metrics from scrapes shared by the requests for
// it: a request that arrives while one is being built waits for it, one
// that arrives within fresh (1 s) of the last one's end gets it, and only
// otherwise is a new one built. A scrape costs work and memory in the
// number of queues (10,000 queues: 6.3 MB written in about 0.5 s of CPU,
// with the topology lock held while they are listed), and /metrics needs
// no credentials: without this, each of max_http_connections clients
// asking at once made a scrape of its own. Now at most one is built at a
// time, at most one a second, and the bytes are shared: what slow readers
// hold is at most http_timeout_ms / fresh + 1 scrapes, however many ask.
type sharedScrape struct {
	build func(io.Writer)
	fresh time.Duration
	now   func() time.Time

	mu     sync.Mutex
	cur    *scrape
	builds int // scrapes built (tests read it)
	joined int // requests that waited for a scrape being built (tests read it)
}

type scrape struct {
	done chan struct{} // closed once b and at are set
	b    []byte
	at   time.Time // when it was done
}

func newSharedScrape(build func(io.Writer)) *sharedScrape {
	return &sharedScrape{build: build, fresh: time.Second, now: time.Now}
}

// get returns a scrape's bytes (shared: not to be changed).
func (s *sharedScrape) get() []byte {
	s.mu.Lock()
	if g := s.cur; g != nil {
		select {
		case <-g.done:
			if s.now().Sub(g.at) < s.fresh {
				s.mu.Unlock()
				return g.b
			}
		default: // being built: wait for it
			s.joined++
			s.mu.Unlock()
			<-g.done
			return g.b
		}
	}
	g := &scrape{done: make(chan struct{})}
	s.cur = g
	s.builds++
	s.mu.Unlock()
	defer close(g.done) // even if build panics: nobody waits for ever
	var buf bytes.Buffer
	s.build(&buf)
	g.b, g.at = buf.Bytes(), s.now()
	return g.b
}
