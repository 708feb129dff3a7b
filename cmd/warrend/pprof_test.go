package main

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestPprofListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := servePprof(ln)
	defer stop()
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/cmdline"} {
		resp, err := http.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) == 0 {
			t.Fatalf("%s: %d %.200s", path, resp.StatusCode, b)
		}
		if path == "/debug/pprof/heap?debug=1" && !strings.Contains(string(b), "heap profile") {
			t.Fatalf("%s: %.200s", path, b)
		}
	}
}
