package client

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-mq/warren/internal/testcerts"
)

// LoadTLS reads a CA and a client certificate from PEM files, and says
// what is wrong with bad ones.
func TestLoadTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "client test CA")
	caFile := filepath.Join(dir, "ca.pem")
	testcerts.WriteFile(t, caFile, ca.CertPEM)
	certFile, keyFile := ca.Client(t, "app").Write(t, dir, "app")
	cfg, err := LoadTLS(caFile, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.MinVersion == 0 {
		t.Fatalf("LoadTLS: %+v", cfg)
	}
	if cfg, err := LoadTLS("", "", ""); err != nil || cfg.RootCAs != nil {
		t.Fatalf("LoadTLS with nothing: %+v, %v; want the system's roots", cfg, err)
	}
	for _, c := range []struct{ ca, cert, key, want string }{
		{certFile + ".missing", "", "", "CA file"},
		{keyFile, "", "", "no PEM certificate"},
		{"", certFile, "", "both"},
		{"", certFile, caFile, "client certificate"},
	} {
		if _, err := LoadTLS(c.ca, c.cert, c.key); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("LoadTLS(%q, %q, %q): %v, want an error with %q", c.ca, c.cert, c.key, err, c.want)
		}
	}
}
