package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/testcerts"
)

// lineWatch is a log writer that signals each line containing want.
type lineWatch struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	hits chan string
}

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for _, line := range strings.Split(string(p), "\n") {
		if strings.Contains(line, w.want) {
			select {
			case w.hits <- line:
			default:
			}
		}
	}
	return len(p), nil
}

func (w *lineWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TLS only: --listen off and --http off with --tls-listen and --https, the
// certificate files from the config file. The SDK and HTTPS both verify
// the broker with the test CA; EXTERNAL authenticates a client
// certificate's CN; SIGHUP picks up a renewed certificate for new
// connections on both ports while an established connection stays up.
func TestWarrendTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "warrend test CA")
	certFile, keyFile := ca.Server(t, "first").Write(t, dir, "server")
	caFile := filepath.Join(dir, "ca.pem")
	testcerts.WriteFile(t, caFile, ca.CertPEM)
	hash, err := runHash("secret")
	if err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{"tls_listen": "127.0.0.1:0", "https": "127.0.0.1:0", "tls_cert": certFile, "tls_key": keyFile,
		"tls_ca": caFile, "users": []map[string]any{{"name": "app", "password_hash": hash}}}
	b, _ := json.Marshal(cfg)
	cfgFile := filepath.Join(dir, "warren.json")
	testcerts.WriteFile(t, cfgFile, b)

	logs := &lineWatch{want: "TLS certificates reloaded", hits: make(chan string, 4)}
	env := map[string]string{"WARREN_DATA": filepath.Join(dir, "data"), "WARREN_DISK_FREE_LIMIT": "-1"}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "off", "--http", "off", "--config", cfgFile},
			func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, logs,
			func(b, h net.Addr) { addrs <- [2]net.Addr{b, h} })
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("warrend did not shut down")
		}
	}()
	var a [2]net.Addr
	select {
	case a = <-addrs:
	case err := <-done:
		done <- err // for the deferred shutdown
		t.Fatalf("warrend exited: %v\n%s", err, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("warrend did not start")
	}
	tlsAddr, httpsAddr := a[0].String(), a[1].String()
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	roots := &tls.Config{RootCAs: ca.Pool()}

	c, err := client.Dial(cctx, "warrens://guest:guest@"+tlsAddr, client.Options{TLS: roots})
	if err != nil {
		t.Fatalf("SDK over TLS: %v", err)
	}
	defer c.Close()
	ch, err := c.Channel(cctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(cctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	mtls := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "app").TLS}}
	ext, err := client.Dial(cctx, "warrens://"+tlsAddr, client.Options{TLS: mtls})
	if err != nil {
		t.Fatalf("EXTERNAL as app: %v", err)
	}
	ext.Close()

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: roots}, Timeout: 10 * time.Second}
	get := func(path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+httpsAddr+path, nil)
		req.SetBasicAuth("guest", "guest")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("HTTPS %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("HTTPS /readyz %d", code)
	}
	if code, body := get("/api/connections"); code != 200 || !strings.Contains(body, `"tls": true`) {
		t.Fatalf("HTTPS /api/connections %d %s, want the TLS connection listed", code, body)
	}

	serverCN := func(addr string) string {
		t.Helper()
		nc, err := tls.Dial("tcp", addr, roots)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		return nc.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := serverCN(tlsAddr); cn != "first" {
		t.Fatalf("server CN %q", cn)
	}
	ca.Server(t, "renewed").Write(t, dir, "server")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-logs.hits:
	case <-time.After(10 * time.Second):
		t.Fatalf("no reload logged after SIGHUP:\n%s", logs.String())
	}
	for _, addr := range []string{tlsAddr, httpsAddr} {
		if cn := serverCN(addr); cn != "renewed" {
			t.Fatalf("%s after SIGHUP: CN %q, want the renewed certificate", addr, cn)
		}
	}
	// The connection made before the reload is still up.
	if err := ch.Publish(cctx, "", client.Message{RoutingKey: "q", Body: []byte("x")}); err != nil {
		t.Fatalf("the connection made before SIGHUP: %v", err)
	}
}

// The TLS settings are checked at start, with errors that say what to do.
func TestWarrendTLSSettingsErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-listen", "127.0.0.1:0"}, "tls_cert"},
		{[]string{"--listen", "off"}, "tls_listen"},
		{[]string{"--https", "127.0.0.1:0", "--tls-cert", filepath.Join(dir, "none.crt"), "--tls-key", filepath.Join(dir, "none.key")}, "none.crt"},
	} {
		env := map[string]string{"WARREN_DATA": filepath.Join(dir, "data")}
		err := run(context.Background(), append([]string{"--http", "127.0.0.1:0"}, c.args...), func(k string) string { return env[k] },
			strings.NewReader(""), io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

func runHash(pass string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"hash-password"}, func(string) string { return "" }, strings.NewReader(pass+"\n"), &out, io.Discard, nil)
	return strings.TrimSpace(out.String()), err
}
