package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio/warrentest"
)

func TestCommandLine(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := filepath.Join(t.TempDir(), "r.json")
	page := filepath.Join(t.TempDir(), "r.html")
	var out, errb bytes.Buffer
	code := run(ctx, []string{"--scenario", "throughput", "--url", warrentest.URL(s), "--count", "30000", "--warmup", "1ms", "--json", js, "--html", page,
		"--broker-pid", strconv.Itoa(os.Getpid())}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "publish→confirm") {
		t.Fatalf("no report:\n%s", out.String())
	}
	var rep map[string]any
	b, _ := os.ReadFile(js)
	if err := json.Unmarshal(b, &rep); err != nil || rep["scenario"] != "throughput" || rep["lost"].(float64) != 0 {
		t.Fatalf("json %s %v", b, err)
	}
	// --broker-pid reaches the run over the scenario (the broker is this
	// process): its CPU per message is reported.
	if v, _ := rep["broker_cpu_us_per_msg"].(float64); v <= 0 {
		t.Fatalf("--broker-pid: no broker CPU per message in %s", b)
	}
	// --html writes the report as a page of its own.
	if h, err := os.ReadFile(page); err != nil || !bytes.HasPrefix(h, []byte("<!DOCTYPE html>")) || !bytes.Contains(h, []byte("broker_cpu_us_per_msg")) {
		t.Fatalf("--html: %v\n%.300s", err, h)
	}
	if code := run(ctx, []string{"--size", "x"}, &out, &errb); code == 0 {
		t.Fatal("bad flag accepted")
	}
}

// compare --html writes the brokers side by side; one that is not
// reachable is skipped and the page says so.
func TestCompareHTML(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	page, md := filepath.Join(dir, "c.html"), filepath.Join(dir, "c.md")
	var out, errb bytes.Buffer
	code := run(ctx, []string{"compare", "--warren-url", warrentest.URL(s), "--amqp-url", "amqp://guest:guest@127.0.0.1:1/",
		"--scenarios", "latency", "--duration", "1s", "--out", md, "--html", page}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	h, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<h2>latency</h2>", ">Warren</td>", "RabbitMQ classic", "not reachable", "<svg"} {
		if !bytes.Contains(h, []byte(want)) {
			t.Errorf("compare --html lacks %q:\n%s", want, h)
		}
	}
}
