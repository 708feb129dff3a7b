package loadtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/warren-mq/warren/internal/testcerts"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// A run over warrens:// with Config.TLS (warren-loadtest --ca): every
// message accounted for.
func TestShortRunOverTLS(t *testing.T) {
	ca := testcerts.NewCA(t, "loadtest CA")
	s := warrentest.StartServer(t, &netio.Config{TLSAddr: "127.0.0.1:0",
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "broker").TLS}}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig("warrens://guest:guest@" + s.TLSAddr().String())
	cfg.Count = 5000
	cfg.TLS = &tls.Config{RootCAs: ca.Pool()}
	var out bytes.Buffer
	rep, err := Run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if rep.Confirmed != 5000 || rep.Consumed != 5000 || rep.Lost != 0 {
		t.Fatalf("counts over TLS: %+v\n%s", rep, out.String())
	}
}
