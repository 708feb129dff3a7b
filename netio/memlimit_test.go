package netio

import (
	"os"
	"path/filepath"
	"testing"
)

func writeFixture(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCgroupMemoryLimit reads the limits of cgroup v1 and v2 hierarchies
// laid out as fixture files.
func TestCgroupMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name  string
		files map[string]string
		self  string
		want  int64 // 0: no limit
	}{
		{"v2 limit on the process's cgroup", map[string]string{
			"cgroup.controllers":       "cpu memory",
			"memory.max":               "max\n",
			"kubepods/pod1/memory.max": "2147483648\n",
		}, "0::/kubepods/pod1\n", 2 * gib},
		{"v2 limit on an ancestor is the tighter one", map[string]string{
			"cgroup.controllers":       "cpu memory",
			"kubepods/memory.max":      "1073741824\n",
			"kubepods/pod1/memory.max": "max\n",
		}, "0::/kubepods/pod1\n", 1 * gib},
		{"v2 in a cgroup namespace (the process's cgroup is the root)", map[string]string{
			"cgroup.controllers": "memory",
			"memory.max":         "536870912\n",
		}, "0::/\n", gib / 2},
		{"v2 unlimited", map[string]string{
			"cgroup.controllers": "memory",
			"app/memory.max":     "max\n",
		}, "0::/app\n", 0},
		{"v1 limit", map[string]string{
			"memory/memory.limit_in_bytes":            "9223372036854771712\n",
			"memory/docker/abc/memory.limit_in_bytes": "3221225472\n",
		}, "9:name=systemd:/docker/abc\n4:memory:/docker/abc\n0::/\n", 3 * gib},
		{"v1 unlimited (the kernel's largest page-aligned value)", map[string]string{
			"memory/memory.limit_in_bytes":               "9223372036854771712\n",
			"memory/process_api/x/memory.limit_in_bytes": "9223372036854771712\n",
		}, "4:memory:/process_api/x\n0::/\n", 0},
		{"v1 path of the host, not mounted here: the mount's own limit", map[string]string{
			"memory/memory.limit_in_bytes": "1073741824\n",
		}, "4:memory:/docker/elsewhere\n", gib},
		{"v1 memory shared with cpu in one line", map[string]string{
			"memory/memory.limit_in_bytes":   "9223372036854771712\n",
			"memory/a/memory.limit_in_bytes": "104857600\n",
		}, "3:cpu,memory:/a\n", 100 << 20},
		{"no cgroup files", map[string]string{}, "0::/\n", 0},
		{"garbage", map[string]string{"cgroup.controllers": "memory", "memory.max": "lots\n"}, "0::/\n", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFixture(t, root, tc.files)
			got := cgroupMemoryLimit(root, tc.self)
			if got != tc.want {
				t.Fatalf("limit %d, want %d", got, tc.want)
			}
		})
	}
}

// TestDefaultHighWaterUsesTheCgroup: the default watermark is 40% of the
// cgroup's limit when it is below the host's RAM.
func TestDefaultHighWaterUsesTheCgroup(t *testing.T) {
	root := t.TempDir()
	writeFixture(t, root, map[string]string{"cgroup.controllers": "memory", "memory.max": "1073741824\n"})
	if got, want := defaultMemoryHighWater(root, "0::/\n", 64<<30), int64(1<<30)*4/10; got != want {
		t.Fatalf("default %d, want %d", got, want)
	}
	if got, want := defaultMemoryHighWater(t.TempDir(), "0::/\n", 64<<30), int64(64<<30)*4/10; got != want {
		t.Fatalf("without a cgroup limit: %d, want %d", got, want)
	}
}
