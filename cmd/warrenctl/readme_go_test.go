package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Every ```go block in the README compiles as pasted: a complete program
// in a module of its own that requires Warren (replaced by this checkout).
func TestReadmeGoCompiles(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t, "go")
	if len(blocks) == 0 {
		t.Fatal("README has no ```go block")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := ""
	for _, l := range strings.Split(string(goMod), "\n") {
		if strings.HasPrefix(l, "go ") {
			goLine = l
		}
	}
	for i, src := range blocks {
		dir := t.TempDir()
		mod := "module readmecheck\n\n" + goLine + "\n\nrequire github.com/warren-mq/warren v0.0.0\n\nreplace github.com/warren-mq/warren => " + root + "\n"
		for name, body := range map[string]string{"go.mod": mod, "go.sum": string(goSum), "main.go": src} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "prog"), ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOPROXY=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("README ```go block %d does not compile as pasted: %v\n%s\n%s", i+1, err, out, src)
		}
	}
}
