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

// Every flag warrend takes is in the usage lines of its help and of the
// README's warrend synopsis, and every WARREN_* variable the flags' help
// names is in the README's list of them: a new user reading either finds
// the cluster flags (--node-id, --peers, --join, …) too.
func TestUsageNamesEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, func(string) string { return "" }, strings.NewReader(""), &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	usage, flags, ok := strings.Cut(out.String(), "\nFlags:\n")
	if !ok {
		t.Fatalf("no Flags: section in the help:\n%s", out.String())
	}
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "```\nwarrend [--listen")
	if i < 0 {
		t.Fatal("no warrend synopsis block in the README")
	}
	synopsis, _, _ := strings.Cut(readme[i+4:], "```")
	envList, _, _ := strings.Cut(readme[strings.Index(readme, "Settings come from, in rising precedence"):], "\n\n")
	n := 0
	for _, line := range strings.Split(flags, "\n") {
		if !strings.HasPrefix(line, "  -") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(line, "  -"), " ")
		n++
		if !strings.Contains(usage, "--"+name) {
			t.Errorf("--%s is not in the help's usage lines", name)
		}
		if !strings.Contains(synopsis, "--"+name) {
			t.Errorf("--%s is not in the README's warrend synopsis", name)
		}
	}
	if n < 20 {
		t.Fatalf("read %d flags from the help:\n%s", n, flags)
	}
	for _, f := range strings.Fields(flags) {
		f = strings.Trim(f, "();,.")
		if strings.HasPrefix(f, "WARREN_") && !strings.Contains(envList, "`"+f+"`") {
			t.Errorf("%s (in the help) is not in the README's list of WARREN_* variables", f)
		}
	}
}
