// Package warrentest starts in-process brokers for tests.
package warrentest

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio"
)

// StartServer starts a broker on an ephemeral loopback port with a
// temporary data directory and returns once it accepts connections. The
// broker is closed when the test ends. cfg may be nil.
func StartServer(t testing.TB, cfg *netio.Config) *netio.Server {
	t.Helper()
	var c netio.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.Logger == nil && os.Getenv("WARREN_TEST_LOG") != "" {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	_ = t.TempDir() // the data directory, once durable queues exist
	s, err := netio.Start(c)
	if err != nil {
		t.Fatalf("warrentest: start broker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Logf("warrentest: close broker: %v", err)
		}
	})
	return s
}

// URL is the warren:// URL for guest on s.
func URL(s *netio.Server) string { return "warren://guest:guest@" + s.Addr().String() }
