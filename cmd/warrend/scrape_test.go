package main

import (
	"io"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Requests for /metrics share scrapes: those that arrive while one is being
// built wait for it (one build for all), one within a second of its end gets
// it, and a later one builds anew. Before, every request built its own (10,000
// queues: 6.3 MB and about 0.5 s of CPU each, for anyone, without credentials).
func TestSharedScrape(t *testing.T) {
	now := time.Unix(1000, 0)
	var clockMu sync.Mutex
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	n := 0
	s := newSharedScrape(func(w io.Writer) {
		n++
		started <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "scrape "+strconv.Itoa(n)+"\n")
	})
	s.now = func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	advance := func(d time.Duration) { clockMu.Lock(); now = now.Add(d); clockMu.Unlock() }

	got := make(chan string, 10)
	get := func() { got <- string(s.get()) }
	go get()
	<-started // the first request is building
	for i := 0; i < 5; i++ {
		go get()
	}
	// Wait until the five have joined the build (polling a counter, with a
	// deadline: they cannot say so otherwise).
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		j := s.joined
		s.mu.Unlock()
		if j == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 requests joined the scrape being built", j)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	for i := 0; i < 6; i++ {
		if b := <-got; b != "scrape 1\n" {
			t.Fatalf("request %d got %q, want the shared scrape 1", i, b)
		}
	}
	advance(999 * time.Millisecond)
	if b := string(s.get()); b != "scrape 1\n" {
		t.Fatalf("within a second of it: %q, want scrape 1 again", b)
	}
	advance(time.Millisecond)
	if b := string(s.get()); b != "scrape 2\n" {
		t.Fatalf("a second after it: %q, want a new scrape", b)
	}
	<-started // the second build's
	if s.builds != 2 {
		t.Fatalf("%d scrapes built for 8 requests, want 2", s.builds)
	}
}
