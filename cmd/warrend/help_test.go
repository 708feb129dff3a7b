package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
)

// --http serves the console and the admin API besides the probes, and
// "off" needs --https: the help and README's usage line say both.
func TestHelpDescribesHTTP(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, func(string) string { return "" }, strings.NewReader(""), &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	i := strings.Index(help, "-http string")
	if i < 0 {
		t.Fatalf("no --http in the help:\n%s", help)
	}
	desc, _, _ := strings.Cut(help[i+len("-http string"):], "\n  -")
	for _, w := range []string{"web console", "admin API", "/metrics", "off", "--https"} {
		if !strings.Contains(desc, w) {
			t.Errorf("--http's help %q does not mention %q", desc, w)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const want = "[--http ADDR|off (off needs --https)]"
	if !strings.Contains(help, want) || !strings.Contains(string(readme), "warrend [--listen ADDR|off] [--amqp-listen ADDR] "+want) {
		t.Errorf("the usage lines (help and README) lack %q", want)
	}
}
