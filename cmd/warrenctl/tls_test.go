package main

import (
	"crypto/tls"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/internal/testcerts"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// warrenctl over TLS: warrens:// for the native protocol and an https://
// admin API, both verified with --ca.
func TestWarrenctlOverTLS(t *testing.T) {
	ca := testcerts.NewCA(t, "warrenctl test CA")
	srvCert := ca.Server(t, "broker")
	srv := warrentest.StartServer(t, &netio.Config{TLSAddr: "127.0.0.1:0", DisablePlain: true,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{srvCert.TLS}}})
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, 0)
	hs := httptest.NewUnstartedServer(a)
	hs.TLS = &tls.Config{Certificates: []tls.Certificate{srvCert.TLS}}
	hs.StartTLS()
	t.Cleanup(func() { hs.Close(); a.Close() })
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	testcerts.WriteFile(t, caFile, ca.CertPEM)

	c := &ctl{t: t, url: "warrens://guest:guest@" + srv.TLSAddr().String(), api: hs.URL}
	if !strings.HasPrefix(hs.URL, "https://") {
		t.Fatalf("admin API at %s", hs.URL)
	}
	c.ok("", "--ca", caFile, "queue", "declare", "orders")
	if _, errs, code := c.run("", "--ca", caFile, "publish", "--routing-key", "orders", "hello"); code != 0 {
		t.Fatalf("publish over TLS: exit %d: %s", code, errs)
	}
	if out := c.ok("", "--ca", caFile, "consume", "orders"); out != "hello\n" {
		t.Fatalf("consume over TLS printed %q", out)
	}
	// Without the CA neither the API nor the broker is trusted.
	if _, errs, code := c.run("", "queue", "list"); code != 1 || !strings.Contains(errs, "certificate") {
		t.Fatalf("without --ca: exit %d, stderr %q; want exit 1 naming the certificate", code, errs)
	}
}
