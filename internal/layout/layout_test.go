package layout

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/warren-mq/warren"

// graph maps each package of the module (its path relative to the module
// root, "queue", "netio/admin") to the module packages it imports, each
// with a file that imports it.
type graph map[string]map[string]edge

// edge is one import: a file that makes it, and whether only test files
// make it (a test may import its package's importers, from an external
// test package, without a cycle).
type edge struct {
	file     string
	testOnly bool
}

// readGraph parses the import clauses of every .go file under root.
// Directories named testdata, or starting with "." or "_", are skipped as
// the go command skips them.
func readGraph(root, modulePath string) (graph, error) {
	g := graph{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if g[pkg] == nil {
			g[pkg] = map[string]edge{}
		}
		test := strings.HasSuffix(name, "_test.go")
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
			dep, ok := strings.CutPrefix(p, modulePath+"/")
			if !ok || dep == pkg {
				continue
			}
			if e, seen := g[pkg][dep]; !seen || (e.testOnly && !test) {
				g[pkg][dep] = edge{file: filepath.ToSlash(filepath.Join(pkg, name)), testOnly: test}
			}
		}
		return nil
	})
	return g, err
}

// under reports whether pkg is dir or inside it.
func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

func underAny(pkg string, dirs ...string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return under(pkg, d) })
}

// violations lists every broken rule of the package doc, sorted.
func violations(g graph) []string {
	var out []string
	for pkg, deps := range g {
		for dep, e := range deps {
			bad := ""
			switch {
			case under(pkg, "wire") && !under(dep, "wire"):
				bad = "wire/ imports no other package of the module"
			case under(pkg, "queue") && !underAny(dep, "queue", "wire"):
				bad = "queue/ imports no package of the module but wire/"
			case under(pkg, "segment") && !underAny(dep, "segment", "wire"):
				bad = "segment/ imports no package of the module but wire/"
			case underAny(pkg, "wire", "queue", "segment", "replication", "broker") && underAny(dep, "netio", "admin", "client"):
				bad = "nothing below netio imports netio/, admin/ or client/"
			case under(pkg, "admin") && !e.testOnly && !underAny(dep, "admin", "broker", "wire"):
				bad = "admin/ imports only broker/ and wire/ (its tests may import more)"
			}
			if bad != "" {
				out = append(out, fmt.Sprintf("%s imports %s (%s): %s", pkg, dep, e.file, bad))
			}
		}
	}
	out = append(out, cycles(g)...)
	slices.Sort(out)
	return out
}

// cycles reports import cycles among the packages' non-test imports, each
// as the path that closes it.
func cycles(g graph) []string {
	const (
		unseen = iota
		onStack
		done
	)
	state := map[string]int{}
	var stack []string
	var out []string
	var visit func(p string)
	visit = func(p string) {
		state[p] = onStack
		stack = append(stack, p)
		deps := make([]string, 0, len(g[p]))
		for d, e := range g[p] {
			if !e.testOnly {
				deps = append(deps, d)
			}
		}
		slices.Sort(deps)
		for _, d := range deps {
			switch state[d] {
			case onStack:
				i := slices.Index(stack, d)
				out = append(out, "import cycle: "+strings.Join(append(slices.Clone(stack[i:]), d), " → "))
			case unseen:
				visit(d)
			}
		}
		stack = stack[:len(stack)-1]
		state[p] = done
	}
	pkgs := make([]string, 0, len(g))
	for p := range g {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, p := range pkgs {
		if state[p] == unseen {
			visit(p)
		}
	}
	return out
}

// TestImportRules checks the module as it is.
func TestImportRules(t *testing.T) {
	g, err := readGraph(filepath.Join("..", ".."), module)
	if err != nil {
		t.Fatal(err)
	}
	// The checker read the module, not an empty directory.
	for _, p := range []string{"wire", "queue", "segment", "netio", "client"} {
		if _, ok := g[p]; !ok {
			t.Fatalf("package %s not found under the module root: %v", p, g)
		}
	}
	if _, ok := g["queue"]["wire"]; !ok {
		t.Fatal("queue's import of wire not seen: the parser reads nothing")
	}
	for _, v := range violations(g) {
		t.Error(v)
	}
}

// TestImportRulesCatchForbiddenImports runs the checker on a fixture
// module that breaks each rule once, next to imports that are allowed.
func TestImportRulesCatchForbiddenImports(t *testing.T) {
	const mod = "example.com/m"
	files := map[string]string{
		"wire/wire.go":              `package wire; import "example.com/m/cmd/tool"`,
		"cmd/tool/tool.go":          `package main`,
		"queue/queue.go":            `package queue; import ("fmt"; "example.com/m/wire"; "example.com/m/queue/route"; "example.com/m/netio")`,
		"queue/route/route.go":      `package route; import "example.com/m/wire"`,
		"queue/queue_test.go":       `package queue; import "example.com/m/segment"`,
		"segment/seg.go":            `package segment; import "example.com/m/wire"`,
		"broker/broker.go":          `package broker; import ("example.com/m/queue"; "example.com/m/client")`,
		"replication/repl.go":       `package replication; import ("example.com/m/segment"; "example.com/m/netio/admin")`,
		"netio/netio.go":            `package netio; import "example.com/m/cycle/a"`,
		"netio/admin/admin.go":      `package admin; import "example.com/m/client"`,
		"client/client.go":          `package client; import "example.com/m/wire"`,
		"cycle/a/a.go":              `package a; import "example.com/m/cycle/b"`,
		"cycle/b/b.go":              `package b; import "example.com/m/cycle/a"`,
		"queue/testdata/x/x.go":     `package x; import "example.com/m/netio"`,
		"segment/.hidden/h.go":      `package h; import "example.com/m/netio"`,
		"other.txt":                 `not go`,
		"segment/segment_x_test.go": `package segment_test; import ("example.com/m/segment"; "example.com/m/wire")`,
		"client/client_test.go":     `package client_test; import ("example.com/m/client"; "example.com/m/netio")`,
		"netio/netio_x_test.go":     `package netio_test; import "example.com/m/netio/admin"`,
		"admin/admin.go":            `package admin; import ("example.com/m/broker"; "example.com/m/wire"; "example.com/m/admin/api"; "example.com/m/netio")`,
		"admin/api/api.go":          `package api; import "example.com/m/client"`,
		"admin/admin_x_test.go":     `package admin_test; import ("example.com/m/admin"; "example.com/m/netio"; "example.com/m/client")`,
	}
	root := t.TempDir()
	for name, body := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g, err := readGraph(root, mod)
	if err != nil {
		t.Fatal(err)
	}
	got := violations(g)
	want := []string{
		"admin imports netio (admin/admin.go): admin/ imports only broker/ and wire/ (its tests may import more)",
		"admin/api imports client (admin/api/api.go): admin/ imports only broker/ and wire/ (its tests may import more)",
		"broker imports client (broker/broker.go): nothing below netio imports netio/, admin/ or client/",
		"import cycle: cycle/a → cycle/b → cycle/a",
		"queue imports netio (queue/queue.go): queue/ imports no package of the module but wire/",
		"queue imports segment (queue/queue_test.go): queue/ imports no package of the module but wire/",
		"replication imports netio/admin (replication/repl.go): nothing below netio imports netio/, admin/ or client/",
		"wire imports cmd/tool (wire/wire.go): wire/ imports no other package of the module",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
