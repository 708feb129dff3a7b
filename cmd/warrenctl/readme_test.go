package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// readmeBlocks returns the README's fenced code blocks of one language.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, part := range strings.Split(string(b), "```"+lang+"\n")[1:] {
		end := strings.Index(part, "```")
		if end < 0 {
			t.Fatalf("README: unterminated ```%s block", lang)
		}
		blocks = append(blocks, part[:end])
	}
	return blocks
}

// The README's warrenctl walk-through, run verbatim (each line through
// bash, with the built warrenctl on PATH) against a fresh broker: every
// line succeeds, and what it says it does happens.
func TestReadmeWalkthrough(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	var lines []string
	for _, b := range readmeBlocks(t, "sh") {
		if !strings.Contains(b, "warrenctl queue declare") {
			continue
		}
		for _, l := range strings.Split(b, "\n") {
			if strings.Contains(l, "warrenctl ") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) == 0 {
		t.Fatal("README has no ```sh block with a warrenctl walk-through")
	}
	c := newCtl(t, nil)
	env := append(os.Environ(), "PATH="+filepath.Dir(binary)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"WARREN_URL="+c.url, "WARREN_API="+c.api)
	countRe := regexp.MustCompile(`--count (\d+)`)
	for _, l := range lines {
		cmd := exec.Command("bash", "-o", "pipefail", "-c", l)
		cmd.Env = env
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("README line failed on a fresh broker: %s\n%v\n%s%s", l, err, out.String(), errb.String())
		}
		f := strings.Fields(strings.SplitN(l, "#", 2)[0])
		switch {
		case len(f) > 1 && f[1] == "consume":
			// consume --count N prints exactly N bodies.
			m := countRe.FindStringSubmatch(l)
			if want, _ := strconv.Atoi(m[1]); strings.Count(out.String(), "\n") != want {
				t.Errorf("%s\nprinted %q, want %d bodies", l, out.String(), want)
			}
		case len(f) > 2 && f[1] == "dlq" && f[2] == "peek":
			if !strings.Contains(out.String(), "rejected in orders") {
				t.Errorf("%s\nshows no death history:\n%s", l, out.String())
			}
		case len(f) > 2 && f[1] == "dlq" && f[2] == "replay":
			if regexpLine(out.String(), "moved", "0") || !strings.Contains(out.String(), "moved") {
				t.Errorf("%s\nmoved nothing:\n%s", l, out.String())
			}
		}
	}
}

// A missing queue is named, with what to do, and without a code that
// reads like an HTTP status.
func TestMissingQueueSaysWhatToDo(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	_, errs, code := c.run("", "dlq", "peek", "orders.dlq")
	if code != 1 || !strings.Contains(errs, `no queue "orders.dlq"`) || !strings.Contains(errs, "warrenctl queue declare orders.dlq") || strings.Contains(errs, "(200)") {
		t.Fatalf("dlq peek of a missing queue: exit %d, %q", code, errs)
	}
}
