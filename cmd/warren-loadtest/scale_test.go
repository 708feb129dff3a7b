package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio/warrentest"
)

// warren-loadtest idle says "open N" once its connections are open, holds
// them until its stdin closes, then says how many closed meanwhile.
func TestIdleHolder(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, inw := io.Pipe()
	outr, outw := io.Pipe()
	var errb bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- idle(ctx, []string{"--url", warrentest.URL(s), "--conns", "7", "--heartbeat", "1s"}, in, outw, &errb)
		outw.Close()
	}()
	buf := make([]byte, 64)
	n, err := outr.Read(buf)
	if err != nil || string(buf[:n]) != "open 7\n" {
		t.Fatalf("first line %q %v (stderr %s)", buf[:n], err, errb.String())
	}
	if got := s.ConnectionCount(); got < 7 {
		t.Fatalf("the broker has %d connections, want at least 7", got)
	}
	inw.Close()
	rest, _ := io.ReadAll(outr)
	if c := <-code; c != 0 || strings.TrimSpace(string(rest)) != "lost 0" {
		t.Fatalf("exit %d, then %q (stderr %s)", c, rest, errb.String())
	}
}
