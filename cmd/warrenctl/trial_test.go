package main

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
)

// A body from stdin loses one trailing newline (echo's; \r\n too), as
// the same body given as an argument would have none; --raw keeps the
// exact bytes. queue delete counts its messages in words.
func TestPublishStdinAndDeleteCount(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	c.ok("", "queue", "declare", "q")
	c.ok("hello\n", "publish", "--routing-key", "q")
	c.ok("two lines\n\n", "publish", "--routing-key", "q")
	c.ok("crlf\r\n", "publish", "--routing-key", "q")
	c.ok("cr\r", "publish", "--routing-key", "q")
	c.ok("exact\n", "publish", "--routing-key", "q", "--raw")
	bodies, _ := c.peekCounts("q")
	want := []string{"hello", "two lines\n", "crlf", "cr\r", "exact\n"}
	if strings.Join(bodies, "|") != strings.Join(want, "|") {
		t.Fatalf("bodies %q, want %q", bodies, want)
	}
	if _, errs, code := c.run("", "publish", "--routing-key", "q", "--raw", "--lines"); code != 2 || !strings.Contains(errs, "exclude") {
		t.Fatalf("--raw --lines: exit %d %q", code, errs)
	}
	if _, errs, code := c.run("", "publish", "--routing-key", "q", "--raw", "arg"); code != 2 || !strings.Contains(errs, "--raw") {
		t.Fatalf("--raw with BODY: exit %d %q", code, errs)
	}
	if _, errs, _ := c.run("", "queue", "delete", "q"); !strings.Contains(errs, "queue q deleted (5 messages)") {
		t.Fatalf("queue delete of 5: %q", errs)
	}
	c.ok("", "queue", "declare", "one")
	c.ok("x", "publish", "--routing-key", "one")
	if _, errs, _ := c.run("", "queue", "delete", "one"); !strings.Contains(errs, "queue one deleted (1 message)\n") {
		t.Fatalf("queue delete of 1: %q", errs)
	}
}

// consume --timeout bounds the wait for the subscribe's answer too: a
// broker that never answers it (here a proxy drops the SUBSCRIBE frame)
// fails the command after --timeout, saying so, not after 10 s.
func TestConsumeTimeoutCoversSubscribe(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	c.ok("", "queue", "declare", "q")
	broker := strings.TrimPrefix(c.url, "warren://guest:guest@")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", broker)
			if err != nil {
				cc.Close()
				return
			}
			go func() { io.Copy(cc, sc); cc.Close() }()
			go dropSubscribes(cc, sc)
		}
	}()
	p := &ctl{t: t, url: "warren://guest:guest@" + ln.Addr().String(), api: c.api}
	start := time.Now()
	_, errs, code := p.run("", "consume", "q", "--timeout", "300ms")
	took := time.Since(start)
	if code != 1 || !strings.Contains(errs, "did not answer the subscribe") || !strings.Contains(errs, "300ms (--timeout)") {
		t.Fatalf("consume with its subscribe unanswered: exit %d %q", code, errs)
	}
	if took > 5*time.Second {
		t.Fatalf("consume --timeout 300ms gave up after %v", took)
	}
}

// dropSubscribes copies a client's bytes to the broker, frame by frame
// after the 8-byte protocol header, leaving out every SUBSCRIBE.
func dropSubscribes(from, to net.Conn) {
	defer to.Close()
	hdr := make([]byte, wire.HeaderSize)
	if _, err := io.ReadFull(from, hdr); err != nil {
		return
	}
	if _, err := to.Write(hdr); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(from, hdr); err != nil {
			return
		}
		f := make([]byte, wire.FrameSize(hdr))
		copy(f, hdr)
		if _, err := io.ReadFull(from, f[wire.HeaderSize:]); err != nil {
			return
		}
		if wire.Type(f[4]) == wire.TypeSubscribe {
			continue
		}
		if _, err := to.Write(f); err != nil {
			return
		}
	}
}
