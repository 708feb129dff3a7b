package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseSize: --disk-free-limit takes a byte count or a size with a
// unit (KB/MB/GB/TB in powers of 1000, KiB/MiB/GiB/TiB in powers of 1024).
func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"2GiB": 2 << 30, "500MB": 500_000_000, "1048576": 1 << 20, "1 KiB": 1024, "3gb": 3_000_000_000, "10B": 10, "1TiB": 1 << 40,
	} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "2XB", "-1GiB", "1.5GiB", "99999999999TiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
}

// TestDiskFreeLimitSettings: a bad --disk-free-limit, WARREN_DISK_FREE_LIMIT
// or disk_free_limit refuses the start with an error naming it.
func TestDiskFreeLimitSettings(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "warren.json")
	if err := os.WriteFile(cfg, []byte(`{"disk_free_limit": "lots"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--disk-free-limit", "2XB"}, nil, "disk-free-limit"},
		{nil, map[string]string{"WARREN_DISK_FREE_LIMIT": "many"}, "disk-free-limit"},
		{[]string{"--config", cfg}, nil, "disk_free_limit"},
	} {
		env := map[string]string{"WARREN_DATA": t.TempDir()}
		for k, v := range c.env {
			env[k] = v
		}
		err := run(context.Background(), append([]string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}, c.args...),
			func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want an error naming %s", c.args, c.env, err, c.want)
		}
	}
}
